"""An MoE training step measured on this device with its own router and with a hot expert (chapter: 9).

The router decides how many rows each expert computes, so what a step allocates depends on the
values. Two routers, on real tensors: the one the model is initialized with (close to
balanced), and the same one with a constant added to expert 0's logit, so that every token
picks expert 0 among its top k (the most skewed router a top-k router can be: expert 0 gets
1/k of the rows). Each step is measured (PyTorch's allocator on a GPU, the book's tensor
accounting on a CPU), and estimated by :func:`memlab.moe.estimate.estimate_moe` with the rows
the step routed (each block's first expert ids, read from the model after the step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from memlab.model.config import ModelConfig, get_config

HOT_LOGIT = 20.0  # added to expert 0's logit: softmax puts it first, the others keep their order

MOE_STEP_SIZES = {
    "ci": dict(config=dict(preset="tiny-moe"), batch_size=4, seq_len=64, precision="fp32"),
    # Mixtral 8x7B's blocks, two of them: 3.2 billion parameters, 8 experts of 176 million each
    "full": dict(config=dict(preset="mixtral-8x7b", n_layer=2), batch_size=1, seq_len=4096,
                 precision="bf16-mixed"),
}


def size_config(config: dict) -> ModelConfig:
    """A size's model: a preset, with fewer blocks if ``n_layer`` is given (chapter: 9)."""
    cfg = get_config(config["preset"])
    if "n_layer" in config and config["n_layer"] != cfg.n_layer:
        cfg = replace(cfg, n_layer=config["n_layer"], name=f"{cfg.name}-{config['n_layer']}-blocks")
    return cfg


class HotExpert:
    """A step's prepare hook: ``bias`` added to expert 0's router logit in every block (chapter: 9).

    It keeps the MoE layers, so their routed rows can be read after the step.
    """

    name = "hot expert"

    def __init__(self, bias: float = HOT_LOGIT):
        self.bias = bias
        self.layers: list = []

    def __call__(self, model) -> None:
        from memlab.model.moe import MoE

        self.layers = [m for m in model.modules() if isinstance(m, MoE)]
        for layer in self.layers:
            if self.bias:
                layer.router.register_forward_hook(self._add)

    def _add(self, module, inputs, out):
        hot = out.new_zeros(out.shape[-1])
        hot[0] = self.bias
        return out + hot  # (N, E): expert 0 first for every token


@dataclass(frozen=True)
class RoutedStep:
    """One measured MoE step beside its estimate for the rows it routed (chapter: 9)."""

    router: str  # 'as initialized' or 'hot expert'
    rows: tuple[int, ...]  # rows per expert in the first block
    busiest_share: float  # the busiest expert's share of the first block's N·k rows
    measured_peak_bytes: int
    estimated_peak_bytes: int
    measured_saved_bytes: int
    estimated_saved_bytes: int
    model_states_bytes: int  # parameters, gradients, optimizer states: measured

    @property
    def peak_ratio(self) -> float:
        """Measured peak over the estimate (chapter: 9)."""
        return self.measured_peak_bytes / self.estimated_peak_bytes

    def as_dict(self) -> dict:
        """The row and its ratio as a plain dict (chapter: 9)."""
        return asdict(self) | {"peak_ratio": self.peak_ratio}


@dataclass(frozen=True)
class MoEStepMeasured:
    """An MoE step measured with each router on this device (chapter: 9)."""

    scale: str
    device: str
    device_name: str
    setup: dict
    parameters: int
    active_parameters: int
    steps: tuple[RoutedStep, ...]

    def as_dict(self) -> dict:
        """The fields, steps with their ratios, as a plain dict (chapter: 9)."""
        return asdict(self) | {"steps": [s.as_dict() for s in self.steps]}


def measure_moe_steps(scale: str = "ci", device=None) -> MoEStepMeasured:
    """Measure an MoE step with its own router and with a hot expert, beside the estimate (chapter: 9)."""
    from memlab.device import device_name, pick_device, refuse_if_too_big
    from memlab.errors import check_choice
    from memlab.measure.step import measure_step
    from memlab.model.moe import Routing
    from memlab.model.step import StepSpec
    from memlab.moe.estimate import estimate_moe

    size = MOE_STEP_SIZES[check_choice("scale", scale, list(MOE_STEP_SIZES))]
    dev = pick_device(device)
    cfg = size_config(size["config"])
    step = dict(batch_size=size["batch_size"], seq_len=size["seq_len"],
                precision=size["precision"])
    conventions = "cuda" if dev.type == "cuda" else "cpu"
    worst = estimate_moe(cfg, routing=Routing([1.0] + [0.0] * (cfg.moe.experts - 1)),
                         device=conventions, **step)  # every row on one expert: the most
    refuse_if_too_big(worst.peak_bytes, dev, f"an MoE step of {cfg.name} (estimated)")
    out = []
    for router, bias in (("as initialized", 0.0), ("hot expert", HOT_LOGIT)):
        hook = HotExpert(bias)
        got = measure_step(StepSpec(cfg, prepare=hook, **step), device=dev)
        rows = tuple(hook.layers[0].rows)
        est = estimate_moe(cfg, routing=Routing(rows), device=conventions, **step)
        out.append(RoutedStep(
            router=router, rows=rows, busiest_share=max(rows) / sum(rows),
            measured_peak_bytes=got.peak_bytes, estimated_peak_bytes=est.peak_bytes,
            measured_saved_bytes=got.saved_activations_bytes,
            estimated_saved_bytes=est.saved_activations_bytes,
            model_states_bytes=got.parameters_bytes + got.gradients_bytes
            + got.optimizer_states_bytes))
    return MoEStepMeasured(scale, dev.type, device_name(dev),
                           dict(model=cfg.name, n_layer=cfg.n_layer, **step),
                           cfg.num_parameters(), cfg.active_parameters(), tuple(out))
