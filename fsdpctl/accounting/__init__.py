"""Where a run's time went (its goodput account): every second from the launch to the release in one
category, in seconds and GPU-hours. ``facts`` reads a run's files, ``account`` divides its time,
``render`` and ``across`` say it, ``cache`` keeps it for the views that show it as a run goes."""
