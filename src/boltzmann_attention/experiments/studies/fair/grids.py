"""The fair study's grids and decisions."""

from __future__ import annotations

from ...recipes import DEFAULT_FIELD_BIAS, FIELD_BIASES, FIRST_RECIPE, J_INIT_STD, J_LR_MULTIPLIERS
from ...sweep import Grid, with_overrides

BOLTZMANN_MODES = ("h", "h+J", "J")



FAIR_SEEDS = (0, 1, 2, 3, 4)
FAIR_T = 12
NOFFN = "noffn-"  # variant prefix of the brackets runs without the FFN (d_ff = 0)


def fair_grids(field_bias: str = DEFAULT_FIELD_BIAS, decisions: None = None) -> list[Grid]:
    """The fair-baselines study, in the order it is run (the most important grids first).

    1. Every field-bias variant for h, h+J and J against one softmax baseline, at T = 12 on both tasks.
    2. Convergence: softmax, h and h+J trained 4x longer at T = 12 on Shakespeare.
    3. The field-bias study on brackets without the FFN (T = 12), where the modes do not all reach 100%.
    4. Sensitivity of J (h+J and J) at T = 12: its learning-rate multiplier and its initialisation, on
       Shakespeare and on brackets without the FFN (with the FFN every mode saturates at T = 12).
    5. The field-bias study again at T = 8 on Shakespeare.
    Seeds are paired: a seed fixes the initialisation and the data order for every mode. Stages 2 and 4 use
    ``field_bias`` (the default's variant); their 1x / zero-init counterpart is the bias-study run.
    Variants: ``fair`` (softmax), ``bias-<b>``, ``long``, ``long-bias-<b>``, ``jlr<m>-bias-<b>``,
    ``jinit<std>-bias-<b>``, each prefixed with NOFFN for the brackets runs without the FFN. In the first
    recipe (``recipes.FIRST_RECIPE``), as committed.
    """
    seeds, T, boltzmann = FAIR_SEEDS, FAIR_T, ("h", "h+J", "J")
    settings = {"shakespeare": ("shakespeare", "", {}), "brackets": ("brackets", "", {}),
                "brackets-noffn": ("brackets", NOFFN, {"d_ff": 0})}

    def bias_study(setting: str, Ts: tuple[int, ...]) -> list[Grid]:
        task, prefix, overrides = settings[setting]
        return [Grid((task,), Ts, modes=("softmax",), seeds=seeds, variant=f"{prefix}fair", overrides=overrides)] + [
            Grid((task,), Ts, modes=boltzmann, seeds=seeds, variant=f"{prefix}bias-{b}", overrides=overrides,
                 field_bias=bias) for b, bias in FIELD_BIASES.items()]

    def sensitivity(setting: str, mode: str) -> list[Grid]:
        task, prefix, overrides = settings[setting]
        grids = [Grid((task,), (T,), modes=(mode,), seeds=seeds, variant=f"{prefix}jlr{m:g}-bias-{field_bias}",
                      overrides={**overrides, "coupling_lr_multiplier": m}, field_bias=FIELD_BIASES[field_bias])
                 for m in J_LR_MULTIPLIERS]
        return grids + [Grid((task,), (T,), modes=(mode,), seeds=seeds,
                             variant=f"{prefix}jinit{J_INIT_STD:g}-bias-{field_bias}",
                             overrides={**overrides, "coupling_init_std": J_INIT_STD},
                             field_bias=FIELD_BIASES[field_bias])]

    grids = bias_study("shakespeare", (T,)) + bias_study("brackets", (T,))
    grids.append(Grid(("shakespeare",), (T,), modes=("softmax",), seeds=seeds, variant="long",
                      overrides={"steps": 16000}))
    grids.append(Grid(("shakespeare",), (T,), modes=("h", "h+J"), seeds=seeds, variant=f"long-bias-{field_bias}",
                      overrides={"steps": 16000}, field_bias=FIELD_BIASES[field_bias]))
    grids += bias_study("brackets-noffn", (T,))
    for mode in ("h+J", "J"):
        grids += sensitivity("shakespeare", mode) + sensitivity("brackets-noffn", mode)
    return with_overrides(grids + bias_study("shakespeare", (8,)), **FIRST_RECIPE)
