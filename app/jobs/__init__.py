"""What a job may do: its handler and context, flow limits, unique, snooze,
effects, artifacts, logs and workflows. Each calls the store; the store
imports none of them."""
