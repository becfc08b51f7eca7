"""`memlab study`: the seeds' whole comparison in one resumable command, and the report they wrote by hand.

    plan = make_plan(options)                    # plan: options checked and resolved (bad input: one line, exit 2)
    Study(plan, state, out, say).run()           # execute: max batch per profile, runs at the common batch (and at max)
    write_report(state, out, plan.baseline)      # report: report.md, report.html, comparison.parquet, commands.txt

state (study.json, resume), recipes (the seeds' experiments, offline check), maxbatch, frame (the results as one
polars frame), findings (sentences computed from it), figures (PNG).
"""

from memlab.core.study.execute import Study
from memlab.core.study.plan import Plan, check_lanes, check_out, make_plan, single_gpu_profiles
from memlab.core.study.recipes import check_reachable, check_recipe, recipe_names
from memlab.core.study.report import write_report
from memlab.core.study.state import Options, StudyState, check_same_study, load_state, stamp

__all__ = [
    "Options", "Plan", "Study", "StudyState", "check_out", "check_reachable", "check_recipe", "check_same_study",
    "check_lanes", "load_state", "make_plan", "recipe_names", "single_gpu_profiles", "stamp", "write_report",
]
