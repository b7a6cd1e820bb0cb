# Rescore worker / launcher image: Beam 2.77 Python 3.11 SDK harness + CUDA torch + Rescore.
# Usable as Dataflow --sdk_container_image, as a Flink worker (--environment_type=DOCKER),
# and as a Flex Template launcher base.
#   docker build -t REGION-docker.pkg.dev/PROJECT/rescore/worker:0.1.0 .
FROM apache/beam_python3.11_sdk:2.77.0

# The CUDA build of the same torch the package pins (the CPU wheel is for CI and laptops).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install --no-cache-dir "torch==2.13.0" --index-url "${TORCH_INDEX}"

WORKDIR /opt/rescore
COPY pyproject.toml README.md ./
COPY pipelines ./pipelines
COPY transforms ./transforms
COPY schemas ./schemas
RUN pip install --no-cache-dir .

# The Beam SDK harness boot binary: workers start here.
ENTRYPOINT ["/opt/apache/beam/boot"]
