"""A runner module of the kind Rescore does not import itself: it defines its own options."""

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineRunner


class CustomRunnerOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser):
        parser.add_argument("--custom_cluster_address", default=None)


class CustomRunner(PipelineRunner):
    def run_pipeline(self, pipeline, options):
        raise NotImplementedError
