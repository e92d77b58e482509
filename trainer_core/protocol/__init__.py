"""What the dashboard, db/ and the worker share, with the standard library only: run status and job kinds,
event records and the event log, control requests, run-folder paths, the metric column list, secret names."""
