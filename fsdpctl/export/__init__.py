"""Where a run's numbers go besides fsdpctl's own files, each writer the one module that imports its library:
TensorBoard event files (``tensorboard``: tensorboardX, google-crc32c), a Prometheus textfile (``prometheus``:
prometheus_client), both from the ``export`` extra, and MLflow's parent run (``mlflow_parent``: mlflow)."""
