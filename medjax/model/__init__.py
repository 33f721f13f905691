"""The fusion model. `create` builds it from config.model and the data's shapes."""

from flax import nnx

from medjax.model import ensemble, fusion

FusionModel = fusion.FusionModel
MISSING_POLICIES = fusion.MISSING_POLICIES
present_modalities = fusion.present_modalities
needs_statistics = fusion.needs_statistics


def create(model_config, *, num_classes: int, shapes,
           seed: int) -> fusion.FusionModel | ensemble.Ensemble:
  """A FusionModel sized by `model_config` for records of `shapes` (records.Shapes), or an
  Ensemble of config.model.members of them."""
  sizes = dict(num_classes=num_classes, image_size=shapes.image_size,
               max_images=shapes.max_images, num_analytes=shapes.num_analytes,
               vitals_steps=shapes.vitals_steps, vitals_channels=shapes.vitals_channels)
  members = int(model_config.get("members", 1))
  rngs = nnx.Rngs(params=seed)
  if members > 1:
    return ensemble.Ensemble(model_config, members, rngs=rngs, **sizes)
  return fusion.FusionModel(model_config, rngs=rngs, **sizes)
