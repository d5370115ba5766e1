"""Every config group's keys, types and defaults, declared once as Hydra structured configs.

The YAML options under configs/ extend these (``defaults: [_<schema>]``), so Hydra itself refuses an
unknown key or a value of the wrong type in any group, preset or command line. A field's trailing
comment is its meaning: ``python -m addernet.config.docs`` turns them into docs/configuration.md.
"""

from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


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


@dataclass
class ViTModel(Model):
    image_size: int = MISSING  # input size (the data's, ${data.image_size})
    patch_size: int = 4  # must divide the image size
    width: int = 64  # embedding width
    depth: int = 4  # transformer blocks
    heads: int = 4  # attention heads
    mlp_ratio: float = 2.0  # MLP hidden width / width
    scores: str = "l1"  # l1: -||q - k||_1 / tau | dot: q.k / tau
    tau: Optional[float] = None  # score scale; null = sqrt(head dim)
    identity: str = "add"  # add: attention map A + I | none
    value: str = "product"  # product: A V | adder: -sum_j |A_ij - V_jc|
    key_grad: str = "hardtanh"  # keys' gradient: hardtanh: HardTanh(q - k) | full: q - k
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
    lr: float = 0.1  # learning rate
    weight_decay: float = 5.0e-4  # L2 weight decay


@dataclass
class SGD(Optim):
    momentum: float = 0.9  # momentum
    nesterov: bool = False  # Nesterov momentum


@dataclass
class AdamW(Optim):
    betas: List[float] = _list(0.9, 0.999)  # Adam's beta1, beta2
    eps: float = 1.0e-8  # Adam's epsilon


@dataclass
class Sched:
    name: str = MISSING  # cosine | cosine_warmup | multistep | step


@dataclass
class Cosine(Sched):
    eta_min: float = 0.0  # the learning rate at the end


@dataclass
class CosineWarmup(Cosine):
    warmup_epochs: int = 5  # linear warm-up epochs
    warmup_start: float = 0.1  # the warm-up's first learning rate, as a fraction of optim.lr


@dataclass
class MultiStep(Sched):
    milestones: List[int] = _list(200, 300)  # epochs where the learning rate is multiplied by gamma
    gamma: float = 0.1  # the factor


@dataclass
class Step(Sched):
    step_size: int = 30  # epochs between multiplications by gamma
    gamma: float = 0.1  # the factor


@dataclass
class AdaptiveLR:
    enabled: bool = True  # the paper's adaptive learning rate of adder layers
    eta: float = 0.2  # eta of eta * sqrt(k) / ||grad||


# ---- trainer ----
@dataclass
class Trainer:
    epochs: int = 400  # training epochs
    device: str = "auto"  # auto (CUDA if present, else CPU) | cpu | cuda | cuda:N
    amp: str = "off"  # off | bf16 | fp16 (fp16 turns on the GradScaler)
    channels_last: bool = False  # channels-last memory format
    backend: str = "${oc.env:ADDERNET_BACKEND,fast}"  # adder kernels: fast | eager | reference (docs/adder_layer.md)
    compile: bool = False  # true: torch.compile the model in place (docs/gpu.md)
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


# ---- task ----
@dataclass
class Task:
    name: str = MISSING  # classification | kd | pkkd
    label_smoothing: float = 0.0  # cross-entropy's label_smoothing (0: off)


@dataclass
class KD(Task):
    teacher: Optional[str] = None  # PATH: one of our checkpoints or a bare state_dict
    teacher_model: Optional[str] = None  # bare state_dict only: the teacher's model name (null: the student's)
    teacher_layer: Optional[str] = None  # bare state_dict only: conv | adder
    temperature: float = 4.0  # T > 0
    alpha: float = 0.9  # weight of the distillation term, in [0, 1]


@dataclass
class PKKD(Task):
    teacher: str = "cotrain"  # cotrain: the CNN twin, trained alongside | PATH: a frozen pretrained twin
    teacher_loss: str = "ce"  # co-trained teacher's loss: ce | dml
    kernel: bool = True  # true: Laplacian / Gaussian kernel maps | false: plain scale-normalised outputs
    layers: Any = "all"  # all adder layers | stage_last | [names]
    temperature: float = 1.0  # T of the logit term
    kd_weight: float = 1.0  # weight of T^2 KL(teacher || student) in the student loss
    feature_weight: float = 1.0  # weight of the mean over layers of mean (rho(g) - h)^2
    sigma_scale: float = 1.0  # kernel width scale s
    sigma_momentum: float = 0.1  # EMA momentum of the kernel widths' running means
    rho_side: str = "student"  # the learned 1x1 map rho: student | teacher
    rho_init: str = "identity"  # identity | default (PyTorch's Conv2d init)
    rho_bias: bool = False  # rho has a bias


# ---- logger ----
@dataclass
class TensorBoardLogger:
    pass


@dataclass
class MLflowLogger:
    tracking_uri: Optional[str] = None  # null: a local file store in <run dir>/mlruns | a server or file: URI
    experiment: str = "addernet"  # MLflow experiment


@dataclass
class WandbLogger:
    mode: str = "offline"  # offline | online | disabled
    project: str = "addernet"  # W&B project


# ---- quant ----
@dataclass
class Quant:
    bits: Optional[int] = None  # null: float model | 2..16 bits for weights and activations
    groups: int = 4  # groups of filters per layer with their own shared scale
    grouping: str = "kmeans"  # kmeans (exact 1-D, deterministic) | kmeans_sklearn (k-means++, seeded)
    calib_images: int = 25600  # training images for the activation ranges and the BatchNorm correction
    calib_batch_size: int = 128  # calibration batch (the per-batch quantile depends on it)
    calib_augment: bool = False  # activation ranges on augmented (true) or validation-transformed images
    act_range: str = "output"  # output: the candidate of least layer-output error | quantile | mse
    act_quantile: float = 0.9994  # quantile of |x| per batch; A = max over batches
    act_range_floor: float = 0.001  # A is at least this
    weight_grid: str = "unsigned"  # unsigned: weights in [0, A] on the activation grid | signed: in [-A, A]
    bn_recalib: bool = True  # correct BatchNorm for the quantised model (quant.bn_method)
    bn_augment: bool = True  # bn_method=reestimate: on the calibration images with the training augmentation
    bn_momentum: Optional[float] = None  # null: exact average over the calibration batches | EMA momentum
    bn_method: str = "shift_scale"  # reestimate (the quantised model's) | shift, shift_scale (the float's, corrected)
    kernel: str = "auto"  # auto | int | fake
    runtime: str = "auto"  # auto | integer | layers
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
    opset: int = 17  # ONNX opset (>= 17)
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
