"""Airflow: rescore each day's new experience on Dataflow, incrementally.

Each run rescores the batches that new, changed or deleted files touch and commits them to the
Delta Lake table at `output` in one transaction (docs/runners.md); one run at a time.

Needs apache-airflow-providers-apache-beam and rescore[gcp] on the Airflow workers. The
options below are Rescore's CLI flags (tests/pipelines/test_runners.py parses them); the operator turns
True into a bare flag and every other value into --name=value.
"""

from datetime import datetime

from airflow import DAG
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

RESCORE_OPTIONS = {
    "config": "/opt/rescore/run_configs/dataflow.yaml",
    "input": "gs://BUCKET/experience/*/*.parquet",
    "output": "gs://BUCKET/scored",
    "strategy": "reward_variance,grpo,duplicate_informative",
    "incremental": True,
    "max_reject_fraction": "0.2",
    "project": "PROJECT",
    "region": "us-central1",
    "temp_location": "gs://BUCKET/tmp",
}

with DAG("rescore_daily", start_date=datetime(2026, 11, 1), schedule="0 3 * * *", catchup=False, max_active_runs=1) as dag:
    BeamRunPythonPipelineOperator(
        task_id="rescore",
        py_file="/opt/rescore/pipelines/cli.py",
        runner="DataflowRunner",
        pipeline_options=RESCORE_OPTIONS,
        py_interpreter="python3.11",
    )
