"""A run as it goes: the copies of its nodes' metrics and GPU samples that one collector keeps in the
run directory here (``collector``), where they are (``layout``), and the snapshots every view of the
run is made from (``model``): ``top``, ``status``, the API's ``Run.watch``, the exports."""
