"""lmprof's one measurement protocol; the doors (pipeline/train.py, infer.py, usercode/, integrations/)
feed it steps. docs/architecture.md draws the house.

spec.py the one spec (counts from lmprof/counts.py) · plan.py the phases, pure · session.py the
orchestrator · driver.py / own_loop.py who owns the loop · windows/ what is measured over which steps
· timing.py one clock · forwards.py where a generation's forwards end · giveway.py the user's own
profiler · observed.py the model · finish/ the typed record and the Run · say.py lmprof's lines ·
triggers.py, probes.py, guard.py, ending.py, active.py, messages.py, folder.py the rest.
"""
