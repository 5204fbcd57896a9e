"""The model: a Decision Transformer (Chen et al., 2021) over (return-to-go, state, action)
tokens with timestep embeddings, predicting each action from the tokens up to its state."""

from __future__ import annotations

from .config import Config

RTG_SCALE = 100.0  # returns-to-go are fed to the model divided by this


def make_model(state_dim: int, num_actions: int, max_timestep: int, cfg: Config):
    import torch
    from torch import nn

    class DecisionTransformer(nn.Module):
        """Tokens r_0, s_0, a_0, r_1, ... (each plus its timestep's embedding) through a
        causal transformer; the output at s_t's token predicts a_t."""

        def __init__(self):
            super().__init__()
            self.timestep = nn.Embedding(max_timestep + 1, cfg.dim)
            self.rtg = nn.Linear(1, cfg.dim)
            self.state = nn.Linear(state_dim, cfg.dim)
            self.action = nn.Embedding(num_actions, cfg.dim)
            self.norm = nn.LayerNorm(cfg.dim)
            # No dropout: data is plentiful for a model this small, and dropout is slow on CPUs.
            layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, 4 * cfg.dim, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
            self.head = nn.Linear(cfg.dim, num_actions)

        def forward(self, rtg, states, actions, timesteps):
            b, t = actions.shape
            time_emb = self.timestep(timesteps.clamp(0, max_timestep))
            tokens = torch.stack([self.rtg(rtg.unsqueeze(-1)) + time_emb, self.state(states) + time_emb,
                                  self.action(actions) + time_emb], dim=2).reshape(b, 3 * t, -1)
            mask = nn.Transformer.generate_square_subsequent_mask(3 * t, device=tokens.device)
            h = self.blocks(self.norm(tokens), mask=mask, is_causal=True)
            return self.head(h[:, 1::3])

    return DecisionTransformer()
