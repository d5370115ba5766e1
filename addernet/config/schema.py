"""Every config group's keys, types, defaults and value checks, declared once as Hydra structured configs.

The YAML options under configs/ extend these (``defaults: [_<schema>]``) and state only the values in which
they differ, so Hydra itself refuses an unknown key or a value of the wrong type in any group, preset or
command line. A field's trailing comment is its meaning: ``python -m addernet.config.docs`` turns them,
with the values each option composes to, into docs/configuration.md.

A class's ``__post_init__`` checks the values of its own fields (ranges, choices, the rules among its own
fields); it runs when ``OmegaConf.to_object`` turns a composed config into these classes, which the entry
points do once, before anything is built (addernet.engine.config). The rules between groups, and the names
looked up in a registry (optimizers, schedules, kernels, tasks, loggers), are checked there too.
"""

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch
from hydra.core.config_store import ConfigStore
from omegaconf import II, MISSING, OmegaConf

from ..checks import choice, number
from ..errors import ConfigError

AMP = ("off", "bf16", "fp16")  # trainer.amp: the autocast dtypes of addernet.forward


def _list(*values):
    return field(default_factory=lambda: list(values))


def _open():
    """An empty group that takes ``group.key=`` overrides before its option is known (test.py: the checkpoint's)."""
    return field(default_factory=lambda: OmegaConf.create({}, flags={"struct": False}))


# ---- model ----
@dataclass
class Model:
    name: str = MISSING  # a registered model (configs/model/)
    layer: str = "adder"  # adder | conv (the CNN twin of identical structure)

    def __post_init__(self):
        choice(self, "layer", "model.layer", ("adder", "conv"))


@dataclass
class TorchvisionModel(Model):
    arch: str = "resnet18"  # any name of torchvision.models.list_models(module=torchvision.models)
    keep_first: bool = True  # the first convolution stays nn.Conv2d (the paper's choice)
    keep_last: bool = True  # the classifier (last conv/linear layer) stays multiplicative (the paper's choice)
    linear: bool = False  # true: nn.Linear layers become AdderLinear too
    include: Optional[List[str]] = None  # null, or module-name patterns (fnmatch), e.g. [layer3.*]: only those convert
    exclude: List[str] = _list()  # module-name patterns that stay multiplicative
    missing_norm: str = "warn"  # an adder layer feeding no norm layer: warn | error | insert | ignore


@dataclass
class LeNetModel(Model):
    adder_layers: str = "body"  # body: conv2 only (stem and classifier multiplicative) | all: every conv and fc
    # (the paper's network, Sec. 4.1)


@dataclass
class ViTModel(Model):
    image_size: int = II("data.image_size")  # input size (the data's)
    patch_size: int = 4  # must divide the image size
    width: int = 64  # embedding width
    depth: int = 4  # transformer blocks
    heads: int = 4  # attention heads
    mlp_ratio: float = 2.0  # MLP hidden width / width
    scores: str = "l1"  # l1: -||q - k||_1 / tau | dot: q.k / tau (this and below: our choices, docs/any_network.md)
    tau: Optional[float] = None  # score scale; null = sqrt(head dim)
    identity: str = "add"  # add: attention map A + I (the identity mapping) | none
    value: str = "product"  # product: A V | adder: -sum_j |A_ij - V_jc|
    key_grad: str = "hardtanh"  # keys' gradient: hardtanh: HardTanh(q - k) | full: q - k (as an adder weight)
    proj: str = "adder"  # q, k, v, output projections: adder (AdderLinear + LayerNorm) | linear
    mlp: str = "adder"  # MLP layers: adder (AdderLinear + LayerNorm) | linear


# ---- data ----
@dataclass
class Data:
    name: str = MISSING  # the option's name (configs/data/)
    kind: str = MISSING  # torchvision (a torchvision.datasets class, data.dataset) | folder | fake
    root: Optional[str] = MISSING  # dataset folder, relative to the directory you launch from
    download: bool = MISSING  # torchvision datasets: download when absent
    num_classes: int = MISSING  # classes of the dataset
    in_channels: int = MISSING  # image channels
    image_size: int = MISSING  # side of the (square) training and evaluation images
    transform: str = MISSING  # plain | cifar (crop + flip) | imagenet (RandomResizedCrop / Resize + CenterCrop)
    mean: List[float] = MISSING  # per-channel normalisation mean
    std: List[float] = MISSING  # per-channel normalisation std (> 0)
    auto_augment: Optional[str] = None  # null: off | randaugment | trivialaugment | autoaugment (training only)
    random_erasing: float = 0.0  # probability of torchvision RandomErasing on a training image (0: off)
    mixup_alpha: float = 0.0  # MixUp Beta(alpha, alpha) of training batches (0: off)
    cutmix_alpha: float = 0.0  # CutMix likewise (0: off; with both set, one of the two per batch)
    train_size: Optional[int] = None  # null: all training images | N: a seeded subset of N
    val_size: Optional[int] = None  # null: all validation images | N: a seeded subset of N
    batch_size: int = 256  # global batch, split across processes under torchrun
    num_workers: Any = "auto"  # auto: min(8, CPUs this process may use / processes per machine) | N
    pin_memory: bool = True  # pinned host memory for the copies to the GPU
    on_device: bool = False  # true: the decoded split on the training device, augmented there (docs/gpu.md)
    skip_corrupt: bool = False  # true: skip unreadable image files (counted per epoch) instead of stopping

    def __post_init__(self):
        for key, example in (("batch_size", 64), ("num_classes", 10), ("in_channels", 3)):
            number(self, key, f"data.{key}", minimum=1, integer=True, example=example)
        if self.num_workers != "auto":
            number(self, "num_workers", "data.num_workers", integer=True, example="4 (or auto)")
        for key in ("mean", "std"):  # Normalize would fail deep inside the data loader instead
            _check_channels(key, getattr(self, key), self.in_channels)
        if number(self, "random_erasing", "data.random_erasing") > 1:
            raise ConfigError(f"data.random_erasing is a probability in [0, 1] (0: off), got {self.random_erasing}.")
        for key in ("mixup_alpha", "cutmix_alpha"):
            number(self, key, f"data.{key} (0: off)")
        augment = [f"data.{k}={getattr(self, k)}" for k in ("auto_augment", "random_erasing") if getattr(self, k)]
        if self.on_device and augment:
            raise ConfigError(
                f"data.on_device=true implements the crop and flip of data.transform only, not "
                f"{' '.join(augment)}; use data.on_device=false (the DataLoader path) for that augmentation."
            )


def _check_channels(key, values, channels):
    """data.mean / data.std: one finite number per channel (std > 0)."""
    if values is not None and len(values) != int(channels):
        raise ConfigError(
            f"data.{key} has {len(values)} value(s) but data.in_channels={channels}; "
            f"give one per channel, e.g. data.{key}=[{','.join(['0.5'] * int(channels))}]."
        )
    ok = (lambda v: v > 0) if key == "std" else (lambda v: True)
    if values is not None and not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v) for v in values
    ):
        raise ConfigError(
            f"data.{key}={list(values)} must hold finite numbers"
            f"{' > 0 (images are divided by it)' if key == 'std' else ''}"
            f"; e.g. data.{key}=[{','.join(['0.5'] * len(values))}]."
        )


@dataclass
class TorchvisionData(Data):
    dataset: Optional[str] = None  # the torchvision.datasets class (data.kind=torchvision)


@dataclass
class FolderData(Data):
    native_size: Optional[int] = None  # every image has this size (another is refused) | null: any size
    train_dir: str = "${data.root}/train"  # ImageFolder tree of the training split
    val_dir: str = "${data.root}/val"  # ImageFolder tree of the validation split


@dataclass
class TorchvisionFolderData(FolderData, TorchvisionData):
    """A folder dataset laid out as a torchvision one (cifar10_folder extends cifar10)."""


# ---- optim, sched, adaptive_lr ----
@dataclass
class Optim:
    name: str = MISSING  # sgd | adamw
    lr: float = 0.1  # learning rate (the paper's, Sec. 4.2)
    weight_decay: float = 5.0e-4  # L2 weight decay on every parameter, BN included (the paper's CIFAR value)

    def __post_init__(self):
        number(self, "lr", "optim.lr", positive=True)
        number(self, "weight_decay", "optim.weight_decay")


@dataclass
class SGD(Optim):
    momentum: float = 0.9  # momentum
    nesterov: bool = False  # Nesterov momentum

    def __post_init__(self):
        super().__post_init__()
        if number(self, "momentum", "optim.momentum") == 0 and self.nesterov:
            raise ConfigError(
                "optim.nesterov=true needs optim.momentum > 0 (Nesterov momentum without momentum "
                "is undefined); set optim.momentum=0.9 or optim.nesterov=false."
            )


@dataclass
class AdamW(Optim):
    """AdamW (ours, not the paper's): its own learning rate and decoupled weight decay."""

    lr: float = 1.0e-3  # learning rate
    weight_decay: float = 0.05  # decoupled weight decay (torch.optim.AdamW)
    betas: List[float] = _list(0.9, 0.999)  # Adam's beta1, beta2
    eps: float = 1.0e-8  # Adam's epsilon

    def __post_init__(self):
        super().__post_init__()
        betas = self.betas
        if betas is None or len(betas) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in betas):
            raise ConfigError(
                f"optim.betas must be two numbers in [0, 1), got {betas!r}; e.g. optim.betas=[0.9,0.999]."
            )
        number(self, "eps", "optim.eps", positive=True)


@dataclass
class Sched:
    name: str = MISSING  # cosine | cosine_warmup | multistep | step


@dataclass
class Cosine(Sched):
    eta_min: float = 0.0  # the learning rate at the end

    def __post_init__(self):
        number(self, "eta_min", "sched.eta_min")


@dataclass
class CosineWarmup(Cosine):
    warmup_epochs: int = 5  # linear warm-up epochs (below trainer.epochs)
    warmup_start: float = 0.1  # the warm-up's first learning rate, as a fraction of optim.lr

    def __post_init__(self):
        super().__post_init__()
        number(self, "warmup_epochs", "sched.warmup_epochs", integer=True)
        if number(self, "warmup_start", "sched.warmup_start", positive=True) > 1:
            raise ConfigError(
                f"sched.warmup_start={self.warmup_start} must be in (0, 1]: the warm-up starts at optim.lr * "
                f"sched.warmup_start and rises to optim.lr; e.g. sched.warmup_start=0.1."
            )


@dataclass
class MultiStep(Sched):
    milestones: List[int] = _list(200, 300)  # epochs where the learning rate is multiplied by gamma
    gamma: float = 0.1  # the factor

    def __post_init__(self):
        number(self, "gamma", "sched.gamma", positive=True)
        milestones = self.milestones
        if (
            milestones is None
            or not all(isinstance(m, int) and m >= 1 for m in milestones)
            or list(milestones) != sorted(milestones)
        ):
            raise ConfigError(
                f"sched.milestones must be increasing epoch numbers >= 1, got {milestones!r}; "
                f"e.g. sched.milestones=[200,300]."
            )


@dataclass
class Step(Sched):
    step_size: int = 30  # epochs between multiplications by gamma
    gamma: float = 0.1  # the factor

    def __post_init__(self):
        number(self, "gamma", "sched.gamma", positive=True)
        number(self, "step_size", "sched.step_size", minimum=1, integer=True)


@dataclass
class AdaptiveLR:
    enabled: bool = True  # the paper's adaptive learning rate of adder layers (Eq. 12-13)
    eta: float = 0.2  # eta of eta * sqrt(k) / ||grad|| (0.2: the official CIFAR code; the paper's ImageNet: 0.05)

    def __post_init__(self):
        if self.enabled:
            number(self, "eta", "adaptive_lr.eta", positive=True)


# ---- trainer ----
@dataclass
class Trainer:
    epochs: int = 400  # training epochs
    device: str = "auto"  # auto (CUDA if present, else CPU) | cpu | cuda | cuda:N
    amp: str = "off"  # off | bf16 | fp16 (fp16 turns on the GradScaler)
    channels_last: bool = False  # channels-last memory format
    backend: str = "${oc.env:ADDERNET_BACKEND,fast}"  # adder kernels: fast | eager | reference (docs/adder_layer.md)
    compile: bool = False  # true: torch.compile the model in place (docs/gpu.md)
    cuda_graph: bool = False  # true: replay the training forward and backward as CUDA graphs (one GPU; docs/gpu.md)
    deterministic: bool = False  # true: deterministic algorithms, no cuDNN autotuning (exact resume on CPU)
    seed: int = 0  # per-process seed is seed + rank; epoch randomness is f(seed, epoch, rank)
    resume: Optional[str] = None  # a checkpoint to start from when the run dir has no checkpoints/last.pt
    resume_override: bool = False  # true: a resume may change settings the checkpoint was trained with
    dist_timeout: float = 600  # seconds a torchrun process waits for a stalled one before all stop (exit 4)
    sync_bn: bool = False  # SyncBatchNorm under torchrun
    log_every: int = 50  # steps between log lines
    hist_every: int = 10  # epochs between adder-weight histograms in TensorBoard
    progress: bool = True  # tqdm bar on rank 0
    clip_grad_norm: Optional[float] = None  # null: off | max total L2 norm of the gradients
    accumulate: int = 1  # 1: off | N: each batch runs as N micro-batches, one optimizer step
    ema_decay: Optional[float] = None  # null: off | d in (0, 1): weight average e = d e + (1 - d) w after each step
    precise_bn: int = 0  # 0: off | N: re-estimate BatchNorm on N training batches before validating
    retain_freed_memory: bool = True  # glibc keeps freed memory for the next step instead of faulting it back in

    def __post_init__(self):
        number(self, "epochs", "trainer.epochs", minimum=1, integer=True)
        choice(self, "amp", "trainer.amp", AMP)
        if self.device not in ("auto", "cpu") and not self.device.startswith("cuda"):
            raise ConfigError(f"trainer.device={self.device!r} is not valid; use auto, cpu, cuda or cuda:N.")
        if number(self, "seed", "trainer.seed", integer=True) >= 2**32:  # seed + rank, seed + epoch: 64 bits
            raise ConfigError(f"trainer.seed={self.seed} is too large; use an integer in [0, 2**32 - 1].")
        number(self, "dist_timeout", "trainer.dist_timeout", positive=True)
        if isinstance(self.resume, str) and not self.resume.strip():
            raise ConfigError(
                "trainer.resume is empty (an unset shell variable?), so the run would start from scratch; give the "
                "checkpoint or run dir to resume from, or leave trainer.resume out for a fresh start."
            )
        for key in ("log_every", "hist_every", "accumulate"):
            number(self, key, f"trainer.{key}", minimum=1, integer=True)
        if self.clip_grad_norm is not None:
            number(self, "clip_grad_norm", "trainer.clip_grad_norm (or null: off)", positive=True)
        if self.ema_decay is not None:
            if number(self, "ema_decay", "trainer.ema_decay (or null: off)", positive=True) >= 1:
                raise ConfigError(f"trainer.ema_decay must be in (0, 1) (e.g. 0.999; null: off), got {self.ema_decay}.")
        if isinstance(self.precise_bn, bool) or not isinstance(self.precise_bn, int) or self.precise_bn < 0:
            raise ConfigError(
                f"trainer.precise_bn must be a whole number of training batches (0: off), got {self.precise_bn!r}; "
                f"e.g. trainer.precise_bn=16."
            )

    @property
    def memory_format(self):
        """The memory format of the model and its batches (trainer.channels_last)."""
        return torch.channels_last if self.channels_last else torch.contiguous_format


# ---- task ----
@dataclass
class Task:
    name: str = MISSING  # classification | kd | pkkd
    label_smoothing: float = 0.0  # cross-entropy's label_smoothing (0: off); a distilled student's CE term only

    def __post_init__(self):
        if number(self, "label_smoothing", "task.label_smoothing") >= 1:
            raise ConfigError(
                f"task.label_smoothing must be in [0, 1) (0: off; 0.1 is the usual value), got {self.label_smoothing}."
            )


def _check_teacher(teacher, allowed=()):
    if teacher in allowed:
        return
    if not isinstance(teacher, str) or not teacher.strip():
        extra = "".join(f" or task.teacher={a}" for a in allowed)
        raise ConfigError(
            f"task.teacher is not set; give the teacher checkpoint: task.teacher=PATH{extra} (e.g. the "
            f"CNN twin's <run dir>/checkpoints/best.pt)."
        )


@dataclass
class KD(Task):
    teacher: Optional[str] = None  # PATH: one of our checkpoints (its stored config builds it) or a bare state_dict
    teacher_model: Optional[str] = None  # bare state_dict only: the teacher's model name (null: the student's)
    teacher_layer: Optional[str] = None  # bare state_dict only: conv | adder (official .adder files imply adder)
    temperature: float = 4.0  # T > 0 (our default; the usual Hinton et al. value)
    alpha: float = 0.9  # weight of the distillation term, in [0, 1] (our default)

    def __post_init__(self):
        super().__post_init__()
        _check_teacher(self.teacher)
        number(self, "temperature", "task.temperature", positive=True)
        if number(self, "alpha", "task.alpha") > 1:
            raise ConfigError(f"task.alpha must be in [0, 1] (the weight of the distillation term), got {self.alpha}.")


@dataclass
class PKKD(Task):
    """Every default is our choice where the paper's is unknown (docs/distillation.md, "Defaults")."""

    teacher: str = "cotrain"  # cotrain: the CNN twin, fresh, trained alongside (progressive) | PATH: a frozen
    # pretrained twin
    teacher_loss: str = "ce"  # co-trained teacher's loss: ce | dml (ce + kd_weight * T^2 KL(student || teacher))
    kernel: bool = True  # true: Laplacian (adder) / Gaussian (conv) kernel maps | false: plain scale-normalised outputs
    layers: Any = "all"  # all adder layers | stage_last (last of each output resolution) | [names]
    temperature: float = 1.0  # T of the logit term (a "small temperature")
    kd_weight: float = 1.0  # weight of T^2 KL(teacher || student) in the student loss (CE has weight 1)
    feature_weight: float = 1.0  # weight of the mean over layers of mean (rho(g) - h)^2
    sigma_scale: float = 1.0  # sigma_a = s * mean ||x - w||_1, 2 sigma_c^2 = s * mean ||x - w||^2 (running means)
    sigma_momentum: float = 0.1  # EMA momentum of those running means (the first batch sets them)
    rho_side: str = "student"  # the learned 1x1 map rho on the student's kernel maps (train-only) | teacher
    rho_init: str = "identity"  # identity | default (PyTorch's Conv2d init)
    rho_bias: bool = False  # rho has a bias

    def __post_init__(self):
        super().__post_init__()
        _check_teacher(self.teacher, allowed=("cotrain",))
        number(self, "temperature", "task.temperature", positive=True)
        for key in ("kd_weight", "feature_weight"):
            number(self, key, f"task.{key}")
        number(self, "sigma_scale", "task.sigma_scale", positive=True)
        if not 0 < number(self, "sigma_momentum", "task.sigma_momentum", positive=True) <= 1:
            raise ConfigError(f"task.sigma_momentum must be in (0, 1], got {self.sigma_momentum}.")
        choice(self, "teacher_loss", "task.teacher_loss", ("ce", "dml"))
        choice(self, "rho_side", "task.rho_side", ("student", "teacher"))
        choice(self, "rho_init", "task.rho_init", ("identity", "default"))
        layers = self.layers
        if not (layers in ("all", "stage_last") or isinstance(layers, (list, tuple)) and len(layers) > 0):
            raise ConfigError(
                f"task.layers={layers!r} is not valid; use all, stage_last or a list of adder layer "
                f"names, e.g. task.layers=[layer3.2.conv2]."
            )
        if self.teacher != "cotrain" and self.teacher_loss != "ce":
            raise ConfigError(
                f"task.teacher_loss={self.teacher_loss} trains the teacher, but task.teacher="
                f"{self.teacher} is frozen; use task.teacher=cotrain or task.teacher_loss=ce."
            )


# ---- logger ----
@dataclass
class TensorBoardLogger:
    pass


@dataclass
class MLflowLogger:
    tracking_uri: Optional[str] = None  # null: a local file store in <run dir>/mlruns | a server or file: URI
    # (e.g. http://server:5000 or file:/shared/mlruns)
    experiment: str = "addernet"  # MLflow experiment


@dataclass
class WandbLogger:
    mode: str = "offline"  # offline (sync later with `wandb sync <run dir>/wandb/offline-run-*`) | online | disabled
    project: str = "addernet"  # W&B project


# ---- quant ----
@dataclass
class Quant:
    """Post-training quantisation (docs/quantization.md). [V]: as in the AdderQuant code; [ours]: our choice where
    the paper and code leave it open or the code is buggy."""

    bits: Optional[int] = None  # null: float model, no quantisation | 2..16 bits for weights and activations (W = A)
    groups: int = 4  # groups of filters per layer with their own shared scale [V: G = 4 in the code]
    grouping: str = "kmeans"  # kmeans: exact 1-D k-means on max|w| [ours, deterministic] | kmeans_sklearn:
    # k-means++ [V], seeded
    calib_images: int = 25600  # training images for the activation ranges and the BatchNorm correction
    # [code: 202 x 128 = 25,856]
    calib_batch_size: int = 128  # calibration batch [V: 128]; the per-batch quantile depends on it
    calib_augment: bool = False  # activation ranges: false = validation transform on the training split [ours] |
    # true = augmented [code]
    act_range: str = "output"  # output: per layer, of the ranges at quantiles 0.999 ... 1 of |x| (max over
    # batches), the one whose quantised layer is closest to the float layer on the first calibration batch [ours] |
    # quantile: at act_quantile [V] | mse: least squared quantisation error of the inputs [ours]
    act_quantile: float = 0.9994  # act_range=quantile: quantile of |x| per batch; A = max over batches
    # [V: the code's 0.9997 applied twice]
    act_range_floor: float = 0.001  # A is at least this [V]
    weight_grid: str = "unsigned"  # unsigned: weights clamped to [0, A] (exact after a ReLU), b-bit unsigned on the
    # activation grid A/(2^b-1) [ours] | signed: clamped to [-A, A], b-bit signed, grid 2A/(2^b-1) [V]
    bn_recalib: bool = True  # correct BatchNorm for the quantised model, by quant.bn_method [V: adjust_BN]
    bn_augment: bool = True  # bn_method=reestimate: on the calibration images with the training augmentation [V code]
    bn_momentum: Optional[float] = None  # bn_method=reestimate; null: exact average over the calibration batches
    # [ours] | 0.1: the code's EMA (MindSpore 0.9)
    bn_method: str = "shift_scale"  # shift_scale: the float statistics kept, each mean moved by E[x_q] - E[x_f]
    # and each variance scaled by Var[x_q] / Var[x_f] on the calibration images [ours] | shift: the mean only
    # [ours] | reestimate: re-estimated with the quantised model [V]
    kernel: str = "auto"  # auto: integer kernel on CPU, float fake-quant elsewhere | int | fake
    runtime: str = "auto"  # auto: the integer network on CPU for CIFAR ResNets, else the layers | integer |
    # layers [ours]
    seed: int = 0  # calibration subset (and kmeans_sklearn)


# ---- entry points ----
@dataclass
class TrainConfig:
    model: Any = MISSING  # the network (configs/model/)
    data: Any = MISSING  # the dataset (configs/data/)
    optim: Any = MISSING  # the optimizer (configs/optim/)
    sched: Any = MISSING  # the learning-rate schedule (configs/sched/)
    trainer: Any = MISSING  # the run (configs/trainer/)
    adaptive_lr: Any = MISSING  # the adder layers' adaptive learning rate (configs/adaptive_lr/)
    task: Any = MISSING  # the loss (configs/task/)
    logger: Any = None  # experiment trackers (configs/logger/)


@dataclass
class TestConfig:
    model: Any = _open()  # {}: the checkpoint's stored model (configs/model/); model.key= applies on top
    data: Any = _open()  # {}: the checkpoint's stored data (configs/data/); data.key= applies on top
    trainer: Any = MISSING  # device, amp, progress (configs/trainer/)
    quant: Any = MISSING  # post-training quantisation (configs/quant/)
    checkpoint: str = MISSING  # our .pt or an official ResNet20/50-AdderNet.pth
    results_file: Optional[str] = None  # also write the final JSON line to this path
    ema: bool = False  # true: evaluate the checkpoint's weight average (trained with trainer.ema_decay)


@dataclass
class QuantizeConfig(TestConfig):
    out: str = MISSING  # where the quantised checkpoint is written (atomically)
    overwrite: bool = False  # true: out= may replace an existing file (never the input checkpoint)


@dataclass
class ExportConfig(TestConfig):
    out: str = MISSING  # the .onnx file to write
    opset: int = 17  # ONNX opset (17 to 20)
    overwrite: bool = False  # true: out= may replace an existing file (never the input checkpoint)


# (group or None for an entry point's schema, name the YAML files name in their defaults, node, package)
SCHEMAS = [
    ("model", "_model", Model, None),
    ("model", "_torchvision", TorchvisionModel, None),
    ("model", "_lenet", LeNetModel, None),
    ("model", "_vit", ViTModel, None),
    ("data", "_data", Data, None),
    ("data", "_torchvision", TorchvisionData, None),
    ("data", "_folder", FolderData, None),
    ("data", "_torchvision_folder", TorchvisionFolderData, None),
    ("optim", "_sgd", SGD, None),
    ("optim", "_adamw", AdamW, None),
    ("sched", "_cosine", Cosine, None),
    ("sched", "_cosine_warmup", CosineWarmup, None),
    ("sched", "_multistep", MultiStep, None),
    ("sched", "_step", Step, None),
    ("adaptive_lr", "_adaptive_lr", AdaptiveLR, None),
    ("trainer", "_trainer", Trainer, None),
    ("task", "_task", Task, None),
    ("task", "_kd", KD, None),
    ("task", "_pkkd", PKKD, None),
    ("logger", "_tensorboard", TensorBoardLogger, "logger.tensorboard"),
    ("logger", "_mlflow", MLflowLogger, "logger.mlflow"),
    ("logger", "_wandb", WandbLogger, "logger.wandb"),
    ("quant", "_quant", Quant, None),
    (None, "_train", TrainConfig, None),
    (None, "_test", TestConfig, None),
    (None, "_quantize", QuantizeConfig, None),
    (None, "_export_onnx", ExportConfig, None),
]


def register():
    """Put the schemas in Hydra's ConfigStore (idempotent); every entry point calls this before composing."""
    store = ConfigStore.instance()
    for group, name, node, package in SCHEMAS:
        store.store(group=group, name=name, node=node, package=package, provider="addernet")
