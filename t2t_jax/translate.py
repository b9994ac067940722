"""`t2t_jax.translate.Translator`, the notebook entry point (defined in decoding.translator)."""

from t2t_jax.decoding.translator import TranslateError, Translator, load_config

__all__ = ["TranslateError", "Translator", "load_config"]
