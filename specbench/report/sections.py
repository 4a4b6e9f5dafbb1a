"""The report page's sections and their plot builders, in page order. Its own module, above
the builders: each builder module imports the shared pieces of `specbench.report.plots`, and
this one imports every builder module, so no builder module is imported back.

Boundary: names builders; draws nothing.
"""

from __future__ import annotations

from specbench.report import acceptance_plots as acc
from specbench.report import cliff, correctness_plots, model_view, scenario_plots
from specbench.report import speed_plots as speed
from specbench.report import tree_plots as tree
from specbench.report.plots import Builder


def sections() -> list[tuple[str, list[Builder]]]:
    """(section, builders), in page order."""
    return [
        ("Speed", [speed.tpot_vs_k, speed.speedup_heatmap, cliff.by_batch_size, speed.tail_latency,
                   speed.memory]),
        ("Acceptance", [acc.acceptance_length_histogram, acc.survival, acc.rejection_positions,
                        acc.by_category, scenario_plots.by_scenario, scenario_plots.by_turn, cliff.by_context, cliff.by_output_position]),
        ("Draft trees", [tree.tree_acceptance, tree.speedup_by_tree_size]),
        ("Speedup model", [model_view.parity, model_view.prediction]),
        ("Correctness and scheduling", [correctness_plots.regression, correctness_plots.batch_sizes]),
    ]
