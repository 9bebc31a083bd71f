"""Tiny saved LeRobot policies for the tests (import as ``tests.lerobot._tiny``; needs lerobot)."""

from __future__ import annotations

import torch

STATE_DIM, ACTION_DIM = 28, 2


def save(policy, cfg, stats, directory):
    """``save_pretrained`` of the policy and its processors (built from ``stats``) into ``directory``."""
    from lerobot.policies.factory import make_pre_post_processors

    pre, post = make_pre_post_processors(cfg, dataset_stats=stats)
    policy.save_pretrained(directory)
    pre.save_pretrained(directory)
    post.save_pretrained(directory)
    return directory


def features(image: bool = True, instruction_dims: int = 0):
    """Input features, output features and normalisation stats shaped like the built-in task's observations."""
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(FeatureType.STATE, (STATE_DIM,))}
    stats = {
        "observation.state": {
            "mean": torch.zeros(STATE_DIM),
            "std": torch.ones(STATE_DIM),
            "min": -torch.ones(STATE_DIM),
            "max": torch.ones(STATE_DIM),
        },
        "action": {
            "mean": torch.zeros(ACTION_DIM),
            "std": torch.full((ACTION_DIM,), 0.5),
            "min": -torch.ones(ACTION_DIM),
            "max": torch.ones(ACTION_DIM),
        },
    }
    if image:
        inputs["observation.images.front"] = PolicyFeature(FeatureType.VISUAL, (3, 64, 64))
        stats["observation.images.front"] = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
    if instruction_dims:
        d = instruction_dims
        inputs["observation.environment_state"] = PolicyFeature(FeatureType.ENV, (d,))
        stats["observation.environment_state"] = {
            "mean": torch.zeros(d),
            "std": torch.ones(d),
            "min": torch.zeros(d),
            "max": torch.full((d,), 2.0),
        }
    return inputs, {"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))}, stats


def act(directory, image: bool = True, instruction_dims: int = 0, seed: int = 0):
    """A tiny ACT (no pretrained backbone), saved with its processors into ``directory``."""
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.policies.act.modeling_act import ACTPolicy

    inputs, outputs, stats = features(image, instruction_dims)
    cfg = ACTConfig(
        input_features=inputs,
        output_features=outputs,
        chunk_size=6,
        n_action_steps=6,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=8,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    torch.manual_seed(seed)
    return save(ACTPolicy(cfg), cfg, stats, directory)


def diffusion(directory, scheduler: str):
    """A tiny Diffusion Policy (two observation steps, 3 denoising steps), saved with its processors."""
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

    inputs, outputs, stats = features()
    cfg = DiffusionConfig(
        input_features=inputs,
        output_features=outputs,
        n_obs_steps=2,
        horizon=8,
        n_action_steps=4,
        crop_shape=None,
        down_dims=(16, 32),
        kernel_size=3,
        n_groups=4,
        diffusion_step_embed_dim=16,
        spatial_softmax_num_keypoints=8,
        noise_scheduler_type=scheduler,
        num_train_timesteps=10,
        num_inference_steps=3,
        pretrained_backbone_weights=None,
        device="cpu",
    )
    torch.manual_seed(0)
    return save(DiffusionPolicy(cfg), cfg, stats, directory)
