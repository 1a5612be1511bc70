"""What the model families share: the decoder contract (base.py), attention / MLP / norm / rotary blocks
(blocks.py), MoE (moe.py), Mamba-2 (mamba2.py), weight recipes (spec.py, fused.py), config reading (config_io.py,
mmproj_config.py) and the vision towers (vision_lm.py, siglip.py, qwen_vl.py). Parts never import a family."""
