"""Training drafters for a loaded target on this machine (`specdesk train-drafter`).

Data comes from the target itself (self-distillation: it answers a prompt set, and what the
drafter reads and the target's top-k log-probabilities are recorded), training runs on the
PyTorch engine's own modules, and a trained drafter is adopted only when a measured compare
says it beats the best method the target already has.
"""
