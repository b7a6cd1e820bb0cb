"""ScoreGroups on a TestPipeline: filter, GRPO and duplication over a bucket's light rows give
each row its outcome with the spec's score, group metrics, and the copy planner's metadata."""

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to
from shell_data import gathered, grpo, light_table, pipeline

from rescore.transforms.rows.outcomes import FILTERED, REJECTED, SCORED
from rescore.transforms.score import ScoreGroups
from rescore.transforms.strategies import build_chain
from rescore.transforms.settings import StepSettings


def test_score_groups_scores_filters_rejects_duplicate_ids_and_describes_groups():
    # unit 0: batch 0 (task 1 informative, task 2 zero spread); unit 1: batch 1 task 1, and an
    # id (batch 1, task 4, run 0) that appears twice.
    unit0 = light_table(0, [(0, 1, 0, 1.0), (0, 1, 1, 0.0), (0, 1, 2, 0.0), (0, 1, 3, 1.0), (0, 2, 0, 1.0), (0, 2, 1, 1.0)])
    unit1 = light_table(1, [(1, 1, 0, 0.0), (1, 1, 1, 2.0), (1, 4, 0, 1.0), (1, 4, 0, 0.0)])
    chain = build_chain(["reward_variance", "grpo", "duplicate_informative"], {})
    expected = {
        **{(0, row): (SCORED, s) for row, s in enumerate(grpo([1.0, 0.0, 0.0, 1.0]))},
        (0, 4): (FILTERED, None), (0, 5): (FILTERED, None),
        **{(1, row): (SCORED, s) for row, s in enumerate(grpo([0.0, 2.0]))},
        (1, 2): (REJECTED, None), (1, 3): (REJECTED, None),
    }

    def outcomes(items):
        found = {}
        for unit, rec in items:
            for row, status, score, reason in zip(*(rec[c].to_pylist() for c in ("row", "status", "score", "reason"))):
                assert (unit, row) not in found, "a row with two outcomes"
                assert (status == REJECTED) == (reason is not None and reason.startswith("duplicate_id: (batch=1, task=4, run=0, step=0) appears 2 times"))
                found[(unit, row)] = (status, score)
        assert found.keys() == expected.keys()
        for key, (status, score) in expected.items():
            assert found[key][0] == status, key
            if score is not None:
                assert found[key][1] == pytest.approx(score, rel=1e-12, abs=1e-12), key
        return len(found)

    def group_rows(tables):
        return sorted(row for t in tables for row in zip(*(t[c].to_pylist() for c in ("batch", "size", "reward_mean", "filter_rows"))))

    def copy_groups(items):
        return sorted((batch, *row) for batch, t in items for row in zip(*(t[c].to_pylist() for c in ("task", "size", "kept", "informative"))))

    with pipeline() as p:
        scored = (
            p | beam.Create([(3, unit0), (5, unit1)])
            | ScoreGroups(chain, StepSettings(device="cpu", keep_filtered=True))
        )
        assert_that(scored.outcomes | "Outcomes" >> gathered(outcomes), equal_to([10]), label="CheckOutcomes")
        assert_that(
            scored.group_metrics | "Groups" >> gathered(group_rows),
            equal_to([[(0, 2, 1.0, 2), (0, 4, 0.5, 0), (1, 2, 1.0, 0)]]),
            label="CheckGroups",
        )
        assert_that(
            scored.copy_groups | "CopyGroups" >> gathered(copy_groups),
            equal_to([[(0, 1, 4, 4, True), (0, 2, 2, 0, False), (1, 1, 2, 2, True)]]),
            label="CheckCopyGroups",
        )


def _whitened(rewards_by_group: list[list[float]], tokens: int = 3) -> list[float]:
    """The spec's reinforce_plus_plus_baseline over one batch: s = r - mean(G), whitened over the
    batch weighted by action tokens (every row here has `tokens`)."""
    s = [r - sum(g) / len(g) for g in rewards_by_group for r in g]
    w = [tokens] * len(s)
    mu = sum(si * wi for si, wi in zip(s, w)) / sum(w)
    var = sum(wi * (si - mu) ** 2 for si, wi in zip(s, w)) / (sum(w) - 1)
    return [(si - mu) / (var + 1e-8) ** 0.5 for si in s]


def test_score_groups_takes_batch_statistics_across_buckets():
    # batch 0's two groups land in different buckets: the whitening must see both.
    parts = [
        (1, light_table(0, [(0, 1, 0, 1.0), (0, 1, 1, 0.0), (0, 1, 2, 3.0)])),
        (2, light_table(0, [(0, 2, 0, 2.0), (0, 2, 1, 0.0)], first_row=3)),
        (3, light_table(1, [(1, 1, 0, 5.0), (1, 1, 1, 1.0)])),
    ]
    expected = {
        **{(0, row): s for row, s in enumerate(_whitened([[1.0, 0.0, 3.0], [2.0, 0.0]]))},
        **{(1, row): s for row, s in enumerate(_whitened([[5.0, 1.0]]))},
    }

    def scores(items):
        found = {(unit, row): score for unit, rec in items for row, score in zip(rec["row"].to_pylist(), rec["score"].to_pylist())}
        assert found.keys() == expected.keys()
        for key, score in expected.items():
            assert found[key] == pytest.approx(score, rel=1e-9), key
        return sorted(found)

    with pipeline() as p:
        scored = p | beam.Create(parts) | ScoreGroups(build_chain(["reinforce_plus_plus_baseline"], {}), StepSettings(device="cpu"))
        assert_that(scored.outcomes | "Scores" >> gathered(scores), equal_to([sorted(expected)]))
