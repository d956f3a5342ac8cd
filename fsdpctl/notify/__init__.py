"""Notices to people: what a run's events look like as a notice (``message``), the targets they go to
(``targets``: apprise URLs, a command), and the thread that sends them without ever holding up the run
(``sender``). Which events a run has is the API's business (``fsdpctl.api.notifying``)."""
