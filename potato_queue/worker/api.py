"""The contract between the worker and a trainer.

A trainer subclasses :class:`Trainer`: ``validate`` (cheap checks, before any
work), ``fit`` (write model files into ``ctx.workdir``, return a
:class:`FitResult`) and ``predict`` (yield a :class:`Prediction` per item and
schema). It reports through ``ctx.reporter`` and polls ``ctx.should_stop()``
(or calls ``ctx.check_stop()``) between steps. It must not import heavy
packages at module level: the worker imports ``required_modules(params)``
itself, so a missing package becomes exit 3 with an install hint.
"""

from typing import Any, Callable, ClassVar, Dict, Iterable, Iterator, List, Optional, Tuple

from potato_queue.wire.checkpoint import Checkpoint, Checkpoints, default_checkpoint_dir
from potato_queue.wire.events import Reporter

from .bundle import Bundle
from .errors import Cancelled, Preempted
from .parallel import RankInfo
from .spec import SchemaSpec, Spec

__all__ = ["PredictItem", "Prediction", "FitResult", "RunContext", "Trainer", "SCORE_DIGITS", "SCORES_KEPT"]

SCORE_DIGITS = 4  # a prediction's per-label scores, rounded: enough to rank by, small on the wire
SCORES_KEPT = 20  # the most probable labels' scores a prediction carries (a schema of 500 labels stays small)


class PredictItem:
    """One bundle row to predict on."""

    __slots__ = ("instance_id", "text", "split", "row")

    def __init__(self, instance_id: str, text: str, split: str, row: Dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.text = text
        self.split = split
        self.row = row

    @property
    def targets(self) -> Dict[str, Any]:
        """The row's gold targets (empty for unlabeled rows)."""
        return self.row.get("targets") or {}


class Prediction:
    """One predicted label for one item and schema; *scores*: every label's probability, when the trainer
    has them (the server ranks what to label next by their margin, insight/next_items.py); *bare*: the
    payload is the label itself, the one form Potato pre-fills a slider from."""

    __slots__ = ("instance_id", "schema_name", "label", "confidence", "scores", "bare")

    def __init__(
        self,
        instance_id: str,
        schema_name: str,
        label: Any,
        confidence: Optional[float],
        scores: Optional[Dict[str, float]] = None,
        bare: bool = False,
    ) -> None:
        self.instance_id = instance_id
        self.schema_name = schema_name
        self.label = label
        self.confidence = confidence
        self.scores = scores
        self.bare = bare

    @classmethod
    def top(cls, instance_id: str, schema_name: str, labels: List[str], probabilities: Any) -> "Prediction":
        """The most probable of *labels* (one probability each, in order), with the highest SCORES_KEPT scores."""
        values = [float(p) for p in probabilities]
        # a stable sort: of equal probabilities the first label wins, as max() would pick it
        ranked = sorted(range(len(values)), key=values.__getitem__, reverse=True)[:SCORES_KEPT]
        scores = {str(labels[i]): round(values[i], SCORE_DIGITS) for i in ranked}
        return cls(instance_id, schema_name, labels[ranked[0]], values[ranked[0]], scores)

    def to_record(self) -> Dict[str, Any]:
        """The predictions.jsonl line (Potato's shape, and `scores` when there are). A set of labels (a
        multiselect's) is the payload Potato pre-fills a multiselect from: a list of {label, confidence},
        each label's own probability as its confidence; a bare one (a slider's number) is the label alone."""
        confidence = None if self.confidence is None else float(self.confidence)
        if self.bare:
            payload = self.label  # type: Any
        elif isinstance(self.label, list):
            scores = self.scores or {}
            payload = [{"label": label, "confidence": scores.get(label, confidence)} for label in self.label]
        else:
            payload = {"label": self.label, "confidence": confidence}
        record = {
            "instance_id": self.instance_id,
            "schema_name": self.schema_name,
            "payload": payload,
            "confidence": confidence,
        }  # type: Dict[str, Any]
        if self.scores is not None:
            record["scores"] = self.scores
        return record


class FitResult:
    """What ``fit`` produced: artifact paths are relative to the workdir."""

    def __init__(
        self,
        model_version: str,
        artifact_paths: Optional[List[str]] = None,
        metrics: Optional[Dict[str, float]] = None,
        label_order: Optional[List[str]] = None,
        notes: Optional[List[str]] = None,
        steps: int = 0,
    ) -> None:
        self.model_version = model_version
        self.artifact_paths = list(artifact_paths or [])
        self.metrics = dict(metrics or {})
        self.label_order = list(label_order or [])
        self.notes = list(notes or [])
        self.steps = steps


class RunContext:
    """Everything a trainer sees of the run."""

    def __init__(
        self,
        spec: Spec,
        bundle: Bundle,
        reporter: Reporter,
        device: str = "cpu",
        checkpoints: Optional[Checkpoints] = None,
        preempted: Callable[[], bool] = lambda: False,
        rank: Optional[RankInfo] = None,
    ) -> None:
        self.spec = spec
        self.bundle = bundle
        self.reporter = reporter
        self.device = device
        self.checkpoints = checkpoints or Checkpoints(default_checkpoint_dir(spec.workdir))
        self._preempted = preempted
        #: This process's rank in a data-parallel run (worker/parallel.py), None when it runs alone.
        self.rank = rank
        #: While data-parallel ranks train (trainers/parallel.py): (stop here, preempted here) -> what all
        #: ranks decide. Every rank must stop at the same step, or the others wait on it forever.
        self.agree_stop = None  # type: Optional[Callable[[bool, bool], Tuple[bool, bool]]]
        self._agreed_preempted = False

    @property
    def main_rank(self) -> bool:
        """Whether this process reports and writes files: it runs alone, or it is rank 0."""
        return self.rank is None or self.rank.rank == 0

    @property
    def workdir(self) -> str:
        """Where model files (and predictions.jsonl) go."""
        return self.spec.workdir

    @property
    def params(self) -> Dict[str, Any]:
        """The trainer's parameters from the spec."""
        return self.spec.params

    @property
    def schemas(self) -> List[SchemaSpec]:
        """The schemas to train."""
        return self.spec.schemas

    def should_stop(self) -> bool:
        """Whether the run was asked to stop (while data-parallel ranks train: whether any rank was)."""
        stop = self.reporter.should_stop()
        if self.agree_stop is None:
            return stop
        stop, self._agreed_preempted = self.agree_stop(stop, stop and self._preempted())
        return stop

    def _is_preempted(self) -> bool:
        return self._agreed_preempted if self.agree_stop is not None else self._preempted()

    def check_stop(self, where: str = "") -> None:
        """Raise :class:`Cancelled` when the run was asked to stop (:class:`Preempted` when preempted)."""
        if self.should_stop():
            if self._is_preempted():
                raise Preempted("Preempted" + (" " + where if where else ""))
            raise Cancelled("Cancelled" + (" " + where if where else ""))

    def resume_point(self) -> Optional[Checkpoint]:
        """The newest whole checkpoint of this run (a requeued job, a resumed run), said in run.log; or None."""
        found = self.checkpoints.latest()
        if found is not None:
            # A warning, so that run.log says it (info stays in events.jsonl): the run was interrupted before.
            self.reporter.log("warning", "resumed at step %d from the checkpoint in %s" % (found.step, found.path))
        return found

    def checkpoint(self, step: int, write: Callable[[str], None]) -> None:
        """Between steps: save the trainer's state (`write(folder)`) when one is due every
        checkpoint_every_steps, or now when the run is being preempted; then honour a stop."""
        preempting = self.should_stop() and self._is_preempted()
        due = self.checkpoints.due(step) or (preempting and step > 0 and step != self.checkpoints.saved_step)
        if due and self.main_rank:  # the ranks hold the same weights: rank 0 saves them
            self.checkpoints.save(step, write)
            self.reporter.log("info", "checkpoint saved at step %d" % step)
        self.check_stop("at step %d" % step)

    def metric_name(self, schema: SchemaSpec, name: str) -> str:
        """*name*, prefixed ``<schema>/`` when the run trains several schemas."""
        return name if len(self.spec.schemas) == 1 else "%s/%s" % (schema.name, name)


class Trainer:
    """Base class of every trainer."""

    name: ClassVar[str] = ""
    #: Modules the worker imports before fitting (a failure is exit 3).
    requires: ClassVar[Tuple[str, ...]] = ()
    #: Schema kinds this trainer fits.
    kinds: ClassVar[Tuple[str, ...]] = ("nominal",)
    #: What the items must be (the bundle's modality).
    modalities: ClassVar[Tuple[str, ...]] = ("text",)
    #: Whether the worker should resolve ``limits.device`` through torch.
    uses_torch: ClassVar[bool] = False
    #: Save a checkpoint every this many steps unless params.checkpoint_every_steps says (0: only when preempted).
    checkpoint_every_steps: ClassVar[int] = 0
    #: Whether the worker may run it as one rank a GPU when it has several (worker/parallel.py); the trainer
    #: then shares out the data and exchanges gradients (trainers/parallel.py).
    data_parallel: ClassVar[bool] = False
    #: Whether it learns from the train items (a learning curve means something for it; worker/curve.py).
    learns_from_train: ClassVar[bool] = True

    def required_modules(self, params: Dict[str, Any]) -> List[str]:
        """Modules this run needs, given its params."""
        return list(self.requires)

    def validate(self, ctx: RunContext) -> List[str]:
        """Reasons the run cannot proceed; empty means go."""
        foreign = (
            []
            if ctx.bundle.modality in self.modalities
            else [
                "The bundle's items are of the %s modality; %s trains on %s items"
                % (ctx.bundle.modality, self.name, "/".join(self.modalities))
            ]
        )
        return foreign + [
            "Schema '%s' is %s; %s fits %s schemas"
            % (s.name, s.kind or "of a kind the bundle does not name", self.name, "/".join(self.kinds))
            for s in ctx.schemas
            if s.kind not in self.kinds
        ]

    def fit(self, ctx: RunContext) -> FitResult:
        """Train and write model files into ``ctx.workdir``."""
        raise NotImplementedError

    def predict(self, ctx: RunContext, items: Iterable[PredictItem]) -> Iterator[Prediction]:
        """One prediction per item and schema."""
        raise NotImplementedError
