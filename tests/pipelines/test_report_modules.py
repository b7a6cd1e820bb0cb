"""`rescore report` is four modules along its jobs (data, charts, page, command); the data and the
page need neither matplotlib nor torch nor Beam, and the columns the report knows are the
contract's, not a list of its own."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_known_columns_are_the_output_contract():
    from rescore.pipelines.report_data import KNOWN_COLUMNS

    assert KNOWN_COLUMNS == {
        "batch", "task", "run", "step", "reward", "tokens", "prompt_length", "logprobs", "action_mask",
        "advantages", "returns", "score", "copy_index", "source_task", "group_size", "group_reward_mean",
        "group_reward_std", "batch_reward_std", "baseline",
    }


def test_the_report_imports_stay_light():
    code = ("import json, sys\nimport rescore.pipelines.report\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'torch', 'apache_beam'})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []
