#!/bin/bash
# GPU checks in one go, for a lent GPU machine that has Python, torch and CUDA but no network and
# no Rescore environment (benchmarks/README.md, "Scoring kernel"). Run from the repository root:
#
#     bash benchmarks/gpu_check.sh        # results also under $OUT when that is set
#
# What the machine lacks travels as wheels in .whl/ (git-ignored), fetched where pip works, for
# the machine's Python (3.12 on the lent H100/H200 image, which has torch, transformers, pyarrow
# and numpy already):
#
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
#         -d .whl apache-beam==2.77.0 fastavro fasteners httplib2 jsonpickle "objsize<0.8" proto-plus pytz \
#         zstandard "beartype<0.23" "cryptography<51" cffi pycparser orjson
#
# Rescore itself is not installed there: tools/checkout_site maps `rescore.*` to this checkout.
set -u
OUT="${OUT:-/tmp/gpu_check}"; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD/tools/checkout_site PYTHONUNBUFFERED=1
nvidia-smi -L; nproc
python3 -c "import torch, apache_beam, numpy, pyarrow; print('torch', torch.__version__, 'beam', apache_beam.__version__, 'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__, torch.cuda.get_device_name())"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/pipelines/test_device.py tests/transforms/test_models.py::test_cuda_logprobs_match_fp32_cpu 2>&1 | tee $OUT/pytest.log | tail -25
timeout 120 python3 benchmarks/gpu_kernel.py --device cpu cuda 2>&1 | tee $OUT/gpu_kernel.txt
mkdir -p /tmp/b && python3 benchmarks/generate.py --rows 204800 --out /tmp/b/in.parquet >/dev/null
cat > /tmp/b/timed.py <<'PY'
import resource, subprocess, sys, time, json
t = time.perf_counter(); p = subprocess.run(sys.argv[1:]); w = time.perf_counter() - t
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cmd": " ".join(sys.argv[-3:]), "rc": p.returncode, "wall_s": round(w, 2), "cpu_s": round(r.ru_utime + r.ru_stime, 2), "max_rss_mb": round(r.ru_maxrss / 1024)}))
PY
for rep in 1; do for d in cpu cuda; do
  timeout 150 python3 /tmp/b/timed.py python3 -m rescore --input /tmp/b/in.parquet --output /tmp/b/out-$d --strategy grpo --overwrite --quiet --device $d 2>&1 | tail -3 | tee -a $OUT/e2e.txt
done; done
python3 - <<'PY' 2>&1 | tee -a $OUT/e2e.txt
import glob, pyarrow.parquet as pq, numpy as np, filecmp
a = sorted(glob.glob('/tmp/b/out-cpu/scored-*.parquet')); b = sorted(glob.glob('/tmp/b/out-cuda/scored-*.parquet'))
print('files', len(a), len(b), 'byte-identical', all(filecmp.cmp(x, y, shallow=False) for x, y in zip(a, b)))
for x, y in zip(a, b):
    u, v = pq.read_table(x), pq.read_table(y)
    for c in u.column_names:
        if u[c] != v[c]:
            print('differs', x.split('/')[-1], c)
PY
timeout 200 python3 benchmarks/model_stage.py --device cuda --rows 4096 --batch-size 32 --hidden 2048 --layers 16 --dtype bfloat16 --repeats 2 --chain decoupled_geo_rs,grpo 2>&1 | grep -v "Writing model\|it/s" | tail -3 | tee $OUT/model_stage.txt
