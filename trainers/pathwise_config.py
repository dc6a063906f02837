"""The configuration of a pathwise run (OR-Transformer or HPO): its fields with their checks, the network it builds,
the start from another run's weights, and the schedules of the learning rate, the entropy weight and the anchor term,
each a function of the update (trainers/pathwise.py runs the updates)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.nn.attention import SDPBackend

from envs.evaluation import EVAL_HORIZON
from plumbing import validate
from plumbing.errors import first_line
from policies.classical import CLASSICAL_BEST
from policies.names import TABLES_PREFIX, PolicySpec, parse_policy
from trainers.checkpoint import CheckpointError, read_checkpoint
from trainers.config import ConfigError, MethodName, TrainerConfig
from trainers.imitation import TEACHERS, is_teacher
from trainers.networks import SETUP_FEATURES, HPOPerceptron, ORTransformer, ThreeNetworks, TransformerShape

METHODS = (MethodName.OR_TRANSFORMER.value, MethodName.HPO.value)


PRECISIONS = ("float32", "bfloat16")


ATTENTION_KERNELS = {
    "auto": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
"""The exact attention kernels an update may be held to (`attention`); "auto" leaves the choice to torch."""


CUDA_ONLY_KERNELS = ("cudnn", "efficient")


MEMORY_FIELDS = ("memory_budget", "micro_batch", "checkpoint_activations", "compile", "cuda_graphs", "attention")
"""Fields that change how much memory or time an update takes, not its result (to float rounding): a run may resume
with other values."""


NO_WARM_START = {"imitation_updates": 0, "imitation_dagger_updates": 0}
"""The overrides of a pathwise run without a warm start, whatever its preset's (plain and DAgger updates alike)."""


@dataclass(frozen=True)
class TrainConfig(TrainerConfig):
    """One pathwise run (OR-Transformer or HPO): the shared fields and the hybrid losses' settings."""

    method: str = MethodName.OR_TRANSFORMER.value
    """or-transformer (three Transformer encoders) or hpo (three perceptrons on the flat input)."""
    pathwise_weight: float = 1.0
    """alpha_PW, >= 0."""
    critic_weight: float = 0.13
    """alpha_V, >= 0."""
    entropy_start: float = 0.01
    """alpha_H at the first update (>= 0), annealed linearly to entropy_end (>= 0) at the last."""
    entropy_end: float = 0.001
    final_learning_rate: float = 3e-5
    """The learning rate is warmed linearly over `warmup` (>= 0) updates to learning_rate, then cosine-decayed to this (> 0)."""
    warmup: int = 40
    adam_eps: float = 1e-5
    """Adam's epsilon, > 0."""
    checkpoint_every: int = 500
    """Updates between checkpoints (>= 0; 0: only at the end), and imitation updates between a warm start's checkpoints.
    Gradients are clipped for each network separately."""
    imitation_updates: int = 0
    """Supervised updates imitating `imitation_teacher` before update 1 (>= 0; 0: the paper, no warm start)."""
    imitation_teacher: str = CLASSICAL_BEST
    """The policy imitated (trainers.imitation.TEACHERS, or decomposition-lookahead:DIR: the tables that a
    decomposition bound run wrote in DIR, loaded instead of computed), built on the training instance as for
    evaluation."""
    imitation_learning_rate: float = 1e-3
    """The warm start's constant Adam learning rate, > 0."""
    imitation_dagger_updates: int = 0
    """DAgger updates after the `imitation_updates` (>= 0; 0: none): the rollouts go on with the student acting
    (greedy) in each row and step with probability `imitation_student_share`, else the teacher, and the teacher
    labels every visited state (trainers.imitation)."""
    imitation_student_share: float = 1.0
    """In a DAgger update, the probability that the student's decision is the one executed, in [0, 1]."""
    initial_weights: str = ""
    """A checkpoint whose network weights the run starts from (a fine-tune; "" = a fresh network), or a run folder (its
    best.pt, else its checkpoint.pt): the same method and network shape; an OR-Transformer's may come from any n, an
    HPO network only from the same n."""
    precision: str = "float32"
    """The networks' arithmetic: float32, or bfloat16 (autocast; the simulator and the costs stay float32)."""
    tf32: bool | None = None
    """Whether the float32 matrix products of the updates on a GPU use TF32 (true, false), or null: with precision
    bfloat16 only. Set during each update (and imitation update) and restored after it (`matmul_tf32`)."""
    memory_budget: float = 0.0
    """GiB that what an update stores and its activations may take (> 0), or 0: two fifths of a GPU's free memory, on
    the CPU a quarter of the available RAM and at most 0.5 GiB (trainers.memory). Each pass of the update goes through
    its rollouts in the largest micro-batches that fit: the same gradient, to float rounding in float32 (bfloat16:
    docs/methods.md, "Memory")."""
    micro_batch: int = 0
    """Rollouts per micro-batch of every pass (>= 1), or 0: chosen from memory_budget."""
    checkpoint_activations: bool = False
    """OR-Transformer: recompute the quantity encoder's blocks in the backward pass instead of keeping their
    activations (activation checkpointing): larger micro-batches for about a third more quantity-network time."""
    attention: str = "auto"
    """The attention kernel of the updates (ATTENTION_KERNELS): auto (torch's choice), flash, cudnn, efficient
    (memory-efficient) or math; cudnn and efficient on a cuda device only. All compute the same attention, to float
    rounding; which is fastest at the run's shapes is what bench/gpu_probe.py measures."""
    compile: bool = False
    """torch.compile the networks' Transformer blocks (an HPO perceptron whole), forward and backward passes
    (trainers.networks `compile_blocks`); the simulator stays eager."""
    cuda_graphs: bool = False
    """Replay the compiled blocks as CUDA graphs (torch.compile's mode "reduce-overhead"; compiles them whatever
    `compile` says); needs a cuda device."""
    setup_feature: str = "paper"
    """How an OR-Transformer reads the setup cost of the global token: paper (K / (c_scale sigma_ref), eq.
    global_features) or per-item (K / (n c_scale sigma_ref), for a network that acts at other sizes than it was
    trained at; trainers.networks). An hpo network takes paper."""
    validate_every: int = 100
    """Updates between two scores of the greedy policy on the validation set (>= 0; 0: never), which is also scored at
    update 0 and at the last update; the kept network is saved as best.pt (trainers.model_selection)."""
    validation_episodes: int = 64
    """Paths of the validation set (>= 1)."""
    validation_horizon: int = EVAL_HORIZON
    """Steps of each validation path (>= 1); the held-out evaluation's by default."""
    validation_margin: float = 2.0
    """A scored network replaces the kept one when its paired mean difference on the validation paths is below this
    many standard errors of it (>= 0; 0: the lowest score is kept; trainers.model_selection.beats)."""
    critic_warmup_updates: int = 0
    """The first updates that fit the critic alone (>= 0): the open and quantity networks are not stepped, and the
    learning-rate schedule (`learning_rate`) starts after them."""
    anchor_weight: float = 0.0
    """Weight (>= 0) of the anchor term at the actor's first update: the open network's cross-entropy and the quantity
    network's squared error to the network the paper phase started from (`anchor_losses`), decaying linearly to 0 over
    `anchor_updates` (>= 1 when the weight is > 0) of the actor's updates."""
    anchor_updates: int = 0
    restart_periods: float = 20.0
    """A rollout in which some item's stock or backorders exceed this many periods of its mean demand plus one order
    cap starts again from the initial state (`restart_runaways`; > 0), or 0: never (the paper's rollouts run on)."""

    @classmethod
    def memory_fields(cls) -> tuple[str, ...]:
        return MEMORY_FIELDS

    @property
    def uses_tf32(self) -> bool:
        """The `tf32` setting, its default resolved."""
        return self.precision == "bfloat16" if self.tf32 is None else self.tf32

    @property
    def teacher(self) -> PolicySpec:
        """`imitation_teacher` parsed (checked in __post_init__: one of TEACHERS or decomposition-lookahead:DIR)."""
        return parse_policy(self.imitation_teacher, "config field 'imitation_teacher'")

    def __post_init__(self):
        self.require_choice("method", METHODS)
        self.check_shared_fields()
        for name in ("pathwise_weight", "critic_weight", "entropy_start", "entropy_end"):
            self.require_real(name, 0)
        for name in ("final_learning_rate", "adam_eps"):
            self.require_real(name, 0, low_open=True)
        self.require_int("warmup", 0)
        self.require_int("checkpoint_every", 0)
        self.require_int("imitation_updates", 0)
        if not is_teacher(self.imitation_teacher):
            allowed = f"one of {list(TEACHERS)} or {TABLES_PREFIX}DIR"
            raise validate.refuse("config field 'imitation_teacher'", allowed, validate.describe(self.imitation_teacher), error=ConfigError)
        self.require_real("imitation_learning_rate", 0, low_open=True)
        self.require_int("imitation_dagger_updates", 0)
        self.require_real("imitation_student_share", 0, 1)
        if not isinstance(self.initial_weights, str):
            raise ConfigError(f"config field 'initial_weights': expected a checkpoint path or '', got {self.initial_weights!r}")
        self.require_choice("precision", PRECISIONS)
        if self.tf32 is not None and not isinstance(self.tf32, bool):
            allowed = "true, false or null (null: true with precision bfloat16)"
            raise validate.refuse("config field 'tf32'", allowed, validate.describe(self.tf32), error=ConfigError)
        self.require_real("memory_budget", 0)
        self.require_int("micro_batch", 0)
        for name in ("checkpoint_activations", "compile", "cuda_graphs"):
            self.require_bool(name)
        self.require_choice("attention", tuple(ATTENTION_KERNELS))
        if self.attention in CUDA_ONLY_KERNELS and not self.device.startswith("cuda"):
            raise ConfigError(
                f"config field 'attention': the {self.attention} kernel needs device cuda or cuda:K, this run's device is "
                f"'{self.device}' (auto, flash or math there)"
            )
        if self.checkpoint_activations and self.method == MethodName.HPO:
            raise ConfigError("config field 'checkpoint_activations': only an or-transformer has blocks to recompute; hpo takes false")
        if self.cuda_graphs and not self.device.startswith("cuda"):
            raise ConfigError(f"config field 'cuda_graphs': CUDA graphs need device cuda or cuda:K, this run's device is '{self.device}'")
        self.require_choice("setup_feature", SETUP_FEATURES)
        if self.method == MethodName.HPO and self.setup_feature != "paper":
            raise ConfigError("config field 'setup_feature': an hpo network has a fixed n, so it takes 'paper'")
        self.require_int("validate_every", 0)
        self.require_int("validation_episodes", 1)
        self.require_int("validation_horizon", 1, validate.HORIZON_MAX, validate.HORIZON_WHY)
        self.require_real("restart_periods", 0)
        self.require_real("validation_margin", 0)
        self.require_int("critic_warmup_updates", 0, self.updates - 1, "the actor's updates follow it, within 'updates'")
        self.require_real("anchor_weight", 0)
        self.require_int("anchor_updates", 0)
        if self.anchor_weight and not self.anchor_updates:
            raise ConfigError(
                "config field 'anchor_updates': an integer >= 1 when anchor_weight is > 0 (the updates it decays over), got 0"
            )


def build_network(config: TrainConfig, n: int) -> ThreeNetworks:
    if config.method == MethodName.HPO:
        return HPOPerceptron(n, config.hidden)
    return ORTransformer(TransformerShape(config.blocks, config.width, config.heads, config.feed_forward), config.setup_feature)


NETWORK_FIELDS = {
    MethodName.OR_TRANSFORMER.value: ("blocks", "width", "heads", "feed_forward", "setup_feature"),
    MethodName.HPO.value: ("hidden",),
}


def load_initial_weights(model: ThreeNetworks, config: TrainConfig) -> None:
    """Load the network weights of the checkpoint `config.initial_weights` into `model` (a fine-tune's start)."""
    path = config.initial_weights
    try:
        ckpt = read_checkpoint(path, next(model.parameters()).device)
    except CheckpointError as exc:
        raise ConfigError(f"config field 'initial_weights': {exc}") from None
    source = {**{f: getattr(TrainConfig, f) for f in NETWORK_FIELDS[config.method]}, **ckpt["config"]}  # older files lack newer fields
    differ = [f for f in ("method", *NETWORK_FIELDS[config.method]) if source.get(f) != getattr(config, f)]
    if differ:
        found = ", ".join(f"{f} {source.get(f)!r} (this run: {getattr(config, f)!r})" for f in differ)
        raise ConfigError(f"config field 'initial_weights': checkpoint '{path}' holds another network: {found}")
    try:
        model.load_state_dict(ckpt["trainer"]["model"])
    except RuntimeError as exc:
        raise ConfigError(f"config field 'initial_weights': checkpoint '{path}' does not fit this network ({first_line(exc)})") from None


def learning_rate(config: TrainConfig, update: int) -> float:
    """The peak rate during the critic's warm-up (the first `critic_warmup_updates`, the critic alone); from the
    actor's first update a linear warm-up over `warmup` updates to the peak, then cosine decay to the final rate at
    the last update (update is 0-based)."""
    if update < config.critic_warmup_updates:
        return config.learning_rate
    update -= config.critic_warmup_updates
    if update < config.warmup:
        return config.learning_rate * (update + 1) / config.warmup
    span = max(config.updates - config.critic_warmup_updates - config.warmup, 1)
    progress = min((update - config.warmup) / span, 1.0)
    return config.final_learning_rate + 0.5 * (config.learning_rate - config.final_learning_rate) * (1 + math.cos(math.pi * progress))


def anchor_weight(config: TrainConfig, update: int) -> float:
    """The anchor term's weight at `update` (0-based): none during the critic's warm-up, then anchor_weight at the
    actor's first update, decaying linearly to 0 over anchor_updates."""
    actor_update = update - config.critic_warmup_updates
    if not config.anchor_weight or actor_update < 0:
        return 0.0
    return config.anchor_weight * max(0.0, 1.0 - actor_update / config.anchor_updates)


def entropy_weight(config: TrainConfig, update: int) -> float:
    """alpha_H annealed linearly from entropy_start to entropy_end over the run."""
    fraction = update / max(config.updates - 1, 1)
    return config.entropy_start + (config.entropy_end - config.entropy_start) * fraction
