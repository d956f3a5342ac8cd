"""Where a run's numbers go besides fsdpctl's own files: TensorBoard event files and a Prometheus textfile
(standard-library writers), and MLflow's parent run (``mlflow_parent``, the one module that imports mlflow)."""
