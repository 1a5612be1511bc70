"""LoRA adapters served over a base model, several in one step (ops/lora.py): their layout on a model
(layout.py), reading them (adapter.py), their device slots (stacks.py) and which adapter holds which
slot (slots.py)."""
