# Rescore worker / launcher image: Beam 2.77 Python 3.11 SDK harness + CUDA torch + transformers + Rescore.
# Usable as Dataflow --sdk_container_image, as a Flink worker (--environment_type=DOCKER),
# and as a Dataflow Flex Template image (launcher and workers in one image; see docs/runners.md).
#   docker build -t REGION-docker.pkg.dev/PROJECT/rescore/worker:0.1.0 .
FROM gcr.io/dataflow-templates-base/python311-template-launcher-base:latest AS launcher
FROM apache/beam_python3.11_sdk:2.77.0

# The Flex Template launcher binary; it runs FLEX_TEMPLATE_PYTHON_PY_FILE with the template's
# parameters as --name=value flags. Workers ignore it.
COPY --from=launcher /opt/google/dataflow/python_template_launcher /opt/google/dataflow/python_template_launcher
ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/opt/rescore/pipelines/flex_template.py

# The CUDA build of the same torch the package pins (the CPU wheel is for CI and laptops).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --no-cache-dir "torch==2.13.0" --index-url "${TORCH_INDEX}"

WORKDIR /opt/rescore
COPY pyproject.toml README.md ./
COPY rescore ./rescore
COPY pipelines ./pipelines
COPY transforms ./transforms
COPY schemas ./schemas
COPY examples ./examples
COPY run_configs ./run_configs
# [models]: transformers for the model stage (--teacher-model, --reward-model, ...).
RUN pip install --no-cache-dir ".[gcp,models]"

# The Beam SDK harness boot binary: workers start here.
ENTRYPOINT ["/opt/apache/beam/boot"]
