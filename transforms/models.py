"""ComputeModelColumns: the model stage, per row and before the GroupByKey, on Beam RunInference.

    unit indices -> ReadModelInputs (tokens of each valid row, sorted by length)
                 -> RunInference per model (teacher_logprobs / logprobs / reward)
                 -> GroupByUnit (row results only: floats, never tokens or logits)
                 -> WriteModelColumns (one side file per unit) -> unit indices

The side files (`_staging/model/unit-NNNNN.parquet`) are joined wherever a unit is read
(transforms/unit_read.read_unit): the light read, so rewards and log-probs reach the scoring, and
the write step, so they reach the output. The tokens are read once for the models and the
light-row shuffle carries what it carried before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, PredictionResult, RunInference

from rescore.errors import first_line
from rescore.schemas import check_rows
from rescore.schemas.lists import flat_list
from rescore.transforms import device as devices
from rescore.transforms import inference
from rescore.transforms.files import storage
from rescore.transforms.verifier import VerifierProcess, contain_in_process
from rescore.transforms.rows.model_columns import UNIT_RECORD, ModelOptions, extend_schema, unit_side_table
from rescore.transforms.files.row_group_slices import SliceDecoders
from rescore.transforms.input_plan import InputPlan
from rescore.transforms.settings import StepSettings
from rescore.transforms.unit_read import read_unit

MODEL_DIR = "model"
"""Under the output's _staging/: the side files."""
_EXTRA = ("reward", "batch", "task", "run", "step")


def side_file(staging: str, unit: int) -> str:
    return storage.join(staging, MODEL_DIR, f"unit-{unit:05d}.parquet")


def plan_with_models(plan: InputPlan, options: ModelOptions, staging: str) -> tuple[InputPlan, int | None]:
    """Check the model flags before the pipeline starts; returns the input plan as the rest of
    the run sees it (every unit joined with its side file, the schema extended with the
    computed columns) and the longest row every model takes (None: no limit).

    Raises ConfigError (one line) for a missing transformers package, a model directory that
    does not load, a --reward-fn that does not import, or input without tokens.
    """
    for name in ("tokens", "prompt_length"):
        if plan.schema.get_field_index(name) < 0:
            flag = "--teacher-model" if options.teacher_model else "--logprob-model" if options.logprob_model else "--ref-model" if options.ref_model else "--reward-model" if options.reward_model else "--reward-fn"
            raise inference.ModelConfigError(f"{flag} scores the logged tokens, but no input file has a {name!r} column")
    contexts = []
    for flag, path in (("--teacher-model", options.teacher_model), ("--logprob-model", options.logprob_model), ("--reward-model", options.reward_model), ("--ref-model", options.ref_model)):
        if path:
            config = inference.check_model_dir(path, flag)
            contexts.append(inference.context_length(config))
    if options.reward_fn:
        fn = inference.load_reward_fn(options.reward_fn)
        if fn.needs_text:
            if not options.tokenizer:
                raise inference.ModelConfigError(
                    f"--reward-fn {options.reward_fn} takes text (prompt/response): pass --tokenizer DIR to decode the tokens"
                )
            try:
                inference.require_transformers().AutoTokenizer.from_pretrained(options.tokenizer, local_files_only=True)
            except Exception as e:
                raise inference.ModelConfigError(
                    f"--tokenizer {options.tokenizer}: cannot load a tokenizer ({first_line(e)})"
                ) from None
    known = [c for c in contexts if c is not None]
    units = tuple(replace(u, model_file=side_file(staging, u.index)) for u in plan.units)
    extended = replace(plan, units=units, schema=extend_schema(plan.schema, options.columns))
    return extended, (min(known) if known else None)


# --- model handlers: what RunInference loads once per process (or per machine) and calls ---


def _batching(options: ModelOptions) -> dict[str, Any]:
    """Fixed batches of --model-batch-size rows, or of about --model-batch-tokens tokens."""
    if options.batch_tokens:
        return {
            "min_batch_size": options.batch_tokens,
            "max_batch_size": options.batch_tokens,
            "element_size_fn": lambda keyed: max(1, len(keyed[1][0])),
        }
    return {"min_batch_size": options.batch_size, "max_batch_size": options.batch_size}


class _Model:
    """What a handler's load_model returns: the model and the one call RunInference makes.

    One object with one method, so that it also works through Beam's cross-process proxy
    (large_model: one copy per machine, shared by every SDK process)."""

    loads = 0
    """Models this process has loaded (the benchmark checks there is one per run)."""

    def __init__(self, kind: str, path: str, device_choice: str, dtype: str, padding_side: str, tokenizer: str | None,
                 reward_fn_timeout: float | None = None, stats: tuple[str, ...] = ()):
        _Model.loads += 1
        self.kind = kind
        self.stats = stats
        self.device = devices.resolve(device_choice)
        self.padding_side = padding_side
        if kind == "reward_fn":
            self.fn = inference.load_reward_fn(path)
            # With a timeout, every call runs in a worker process that can be killed (a stuck
            # thread cannot); without one, here.
            self.verifier = VerifierProcess(path, reward_fn_timeout) if reward_fn_timeout else None
            if self.verifier is None:  # in this process: what it starts is still ended with the command
                contain_in_process()
            self.tokenizer = None
            if self.fn.needs_text:
                self.tokenizer = inference.require_transformers().AutoTokenizer.from_pretrained(tokenizer)
            return
        dt = inference.torch_dtype(dtype, self.device)
        if kind == "reward":
            self.model = inference.load_reward_model(path, self.device, dt)
            self.pad_id = self.model.config.pad_token_id
        else:
            self.model = inference.load_causal_lm(path, self.device, dt)
            pad_id = self.model.config.pad_token_id
            self.pad_id = 0 if pad_id is None else int(pad_id)

    def __call__(self, examples: Sequence[tuple]) -> list[tuple[Any, str | None]]:
        """[(value, reject reason or None)] for examples (tokens, prompt_length, extras)."""
        rows = [np.asarray(e[0], dtype=np.int64) for e in examples]
        if self.kind == "reward":
            return [(float(v), None) for v in inference.reward_scores(self.model, rows, pad_id=self.pad_id)]
        if self.kind == "reward_fn":
            values = [self._verifier_values(row, e) for row, e in zip(rows, examples)]
            if self.verifier is not None:
                return self.verifier(values)
            return [inference.call_reward_fn(self.fn, v) for v in values]
        if self.stats:  # log-probs and token statistics from one forward pass: {column: values}
            values = inference.response_token_values(
                self.model, rows, [int(e[1]) for e in examples], pad_id=self.pad_id, side=self.padding_side, stats=self.stats
            )
            return [(v, None) for v in values]
        values = inference.response_logprobs(
            self.model, rows, [int(e[1]) for e in examples], pad_id=self.pad_id, side=self.padding_side
        )
        return [(v, None) for v in values]

    def _verifier_values(self, row: np.ndarray, example: tuple) -> dict[str, Any]:
        """What a verifier may take (inference.REWARD_FN_ARGS), as plain Python values."""
        p = int(example[1])
        values = {"prompt_tokens": row[:p].tolist(), "response_tokens": row[p:].tolist(), **example[2]}
        if self.tokenizer is not None:
            values["prompt"] = self.tokenizer.decode(values["prompt_tokens"])
            values["response"] = self.tokenizer.decode(values["response_tokens"])
        return {k: values[k] for k in self.fn.args if k in values}


def _beam_resource_warning(record: logging.LogRecord) -> bool:
    """False for Beam's "Resource module is not available ..." (RunInference's memory metric,
    a root-logger WARNING at every model load) unless the run logs at INFO or DEBUG."""
    return not (
        str(record.msg).startswith("Resource module is not available")
        and logging.getLogger().getEffectiveLevel() > logging.INFO
    )


def _hide_beam_resource_warning() -> None:
    root = logging.getLogger()
    if _beam_resource_warning not in root.filters:
        root.addFilter(_beam_resource_warning)


_hide_beam_resource_warning()  # at import: a worker unpickling the handler imports this module first


class _Handler(ModelHandler):
    """A RunInference model handler for one model of the stage (kind: teacher_logprobs,
    logprobs, reward or reward_fn). Beam's HuggingFaceModelHandler imports TensorFlow and its
    PyTorch handler loads a state_dict; this one loads a Hugging Face directory and returns,
    per row, only the gathered log-probs (or the scalar reward)."""

    def __init__(self, kind: str, path: str, options: ModelOptions, device: str):
        super().__init__(**_batching(options))
        self._kind, self._path, self._options, self._device = kind, path, options, device

    def load_model(self) -> _Model:
        _hide_beam_resource_warning()
        o = self._options
        stats = o.token_stats if self._kind == "logprobs" else ()
        return _Model(self._kind, self._path, self._device, o.dtype, o.padding_side, o.tokenizer, o.reward_fn_timeout, stats)

    def run_inference(self, batch, model, inference_args=None) -> Iterable[PredictionResult]:
        # example=None: the tokens stop here; only the computed values go on.
        return [PredictionResult(None, value, self._kind) for value in model(batch)]

    def share_model_across_processes(self) -> bool:
        # On a GPU, one copy per machine shared by every SDK process of the worker (Beam's
        # large_model); on a CPU, one copy per process, shared by its threads.
        return self._kind != "reward_fn" and self._device != "cpu" and torch.cuda.is_available()

    def model_copies(self) -> int:
        return 1

    def get_num_bytes(self, batch) -> int:
        return sum(len(e[0]) * 8 for e in batch)

    def get_metrics_namespace(self) -> str:
        return f"rescore_model_{self._kind}"


def handlers(options: ModelOptions, device: str) -> list[tuple[str, str, _Handler]]:
    """(output column, kind, handler) for each model the run uses."""
    out = []
    if options.teacher_model:
        out.append(("teacher_logprobs", "teacher_logprobs", _Handler("teacher_logprobs", options.teacher_model, options, device)))
    if options.logprob_model:
        out.append(("logprobs", "logprobs", _Handler("logprobs", options.logprob_model, options, device)))
    if options.ref_model:
        out.append(("ref_logprobs", "ref_logprobs", _Handler("ref_logprobs", options.ref_model, options, device)))
    if options.reward_model:
        out.append(("reward", "reward", _Handler("reward", options.reward_model, options, device)))
    elif options.reward_fn:
        out.append(("reward", "reward_fn", _Handler("reward_fn", options.reward_fn, options, device)))
    return out


# --- DoFns -----------------------------------------------------------------------------------


class _ModelInputs(beam.DoFn):
    """unit -> ((unit, row), (tokens, prompt_length, extras)) for each row a model can score,
    shortest first so that consecutive batches waste little padding; tagged `units`:
    (unit, ("unit", rows, {row: reject reason})) for every unit."""

    UNITS = "units"

    def __init__(self, plan: InputPlan, context: int | None, needs_context: bool, extras: bool):
        self._units = plan.units
        self._context = context
        self._needs_context = needs_context
        self._extras = extras

    def setup(self):
        self._rows = Metrics.counter("rescore", "model_rows")
        self._tokens = Metrics.counter("rescore", "model_tokens")
        # Decoders of sliced row groups for this step's reads: the slices a DoFn reads in order
        # decode each row once. Its own, not the run's UnitStore: the token columns it reads are
        # not the read step's, and RunInference's model is the Shared object of this stage.
        self._slices = SliceDecoders()

    def teardown(self):
        self._slices.clear()

    def process(self, unit_index: int):
        unit = self._units[unit_index]
        columns = ["tokens", "prompt_length", "action_mask", "logprobs", *(_EXTRA if self._extras else ("reward",))]
        table = read_unit(replace(unit, model_file=None), columns, slices=self._slices)
        n = table.num_rows
        reasons: dict[int, str] = {}
        if n and "tokens" not in table.column_names:
            reasons = {i: "model_input: the row has no tokens to score" for i in range(n)}
        elif n:
            ok = check_rows(table).ok  # the light read rejects the other rows with their reasons
            tokens = flat_list(table["tokens"])
            values = np.asarray(tokens.values.to_numpy(zero_copy_only=False), dtype=np.int64)
            lengths = tokens.lengths
            prompt = np.asarray(pc.cast(table["prompt_length"], pa.int64()).fill_null(0).to_numpy(), dtype=np.int64)
            extras = self._row_extras(table) if self._extras else None
            order = np.argsort(lengths, kind="stable")
            for i in order.tolist():
                if not ok[i]:
                    continue
                length, p = int(lengths[i]), int(prompt[i])
                if self._context is not None and length > self._context:
                    reasons[i] = f"model_context: {length} tokens, more than the model's context of {self._context}"
                    continue
                if self._needs_context and p == 0 and length > 0:
                    reasons[i] = "model_input: prompt_length 0 leaves the first response token without context to score it"
                    continue
                self._rows.inc()
                self._tokens.inc(length)
                row_tokens = values[tokens.offsets[i] : tokens.offsets[i + 1]]
                yield (unit_index, i), (row_tokens, p, {} if extras is None else extras[i])
        yield beam.pvalue.TaggedOutput(self.UNITS, (unit_index, (UNIT_RECORD, n, reasons)))

    @staticmethod
    def _row_extras(table: pa.Table) -> list[dict]:
        cols = {k: table[k].to_pylist() if k in table.column_names else [0] * table.num_rows for k in _EXTRA}
        return [{k: cols[k][i] for k in _EXTRA} for i in range(table.num_rows)]


def _by_unit(keyed: tuple[tuple[int, int], PredictionResult]):
    (unit, row), result = keyed
    value, reason = result.inference
    return unit, (result.model_id, row, value, reason)


class _WriteModelColumns(beam.DoFn):
    """(unit, [unit record, row results] in any order) -> the unit's side file; yields the unit
    index. The merge is rows/model_columns.unit_side_table: nothing depends on arrival order."""

    def __init__(self, staging: str, columns: tuple[str, ...]):
        self._staging = staging
        self._columns = columns

    def process(self, element):
        unit, items = element
        storage.write_parquet(unit_side_table(items, self._columns), side_file(self._staging, unit))
        yield unit


class ComputeModelColumns(beam.PTransform):
    """Pipeline -> unit indices, each once its side file of model-computed columns is written.

    `context`: the longest row (tokens) every model of the run takes; longer rows are rejected
    (`model_context`). The RunInference steps carry the accelerator resource hint, nothing else.
    """

    def __init__(
        self, plan: InputPlan, options: ModelOptions, staging: str, settings: StepSettings = StepSettings(), *,
        context: int | None = None,
    ):
        """settings: the run's (device)."""
        super().__init__()
        self._plan = plan
        self._options = options
        self._staging = staging
        self._device = settings.device
        self._context = context

    def expand(self, pbegin):
        models = handlers(self._options, self._device)
        needs_context = any(kind in ("teacher_logprobs", "logprobs", "ref_logprobs") for _, kind, _ in models)
        hints = {"accelerator": self._options.accelerator} if self._options.accelerator else {}
        read = beam.ParDo(
            _ModelInputs(self._plan, self._context, needs_context, extras=bool(self._options.reward_fn))
        ).with_outputs(_ModelInputs.UNITS, main="examples")
        if hints:
            read = read.with_resource_hints(**hints)
        inputs = (
            pbegin
            | "Units" >> beam.Create([u.index for u in self._plan.units])
            | "ReadModelInputs" >> read
        )
        parts = [inputs.units]
        for column, kind, handler in models:
            infer = RunInference(KeyedModelHandler(handler))
            if hints:
                infer = infer.with_resource_hints(**hints)
            parts.append(
                inputs.examples
                | f"RunInference[{column}]" >> infer
                | f"ResultsByUnit[{column}]" >> beam.Map(_by_unit)
            )
        return (
            parts
            | "AllModelOutputs" >> beam.Flatten()
            | "GroupByUnit" >> beam.GroupByKey()
            | "WriteModelColumns" >> beam.ParDo(_WriteModelColumns(self._staging, self._options.columns))
        )
