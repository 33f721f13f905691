"""bench_train's FLOP count (issue 33): from the step's jaxpr, the same for every dtype and
platform, exact for matrix products and convolutions, a scan's body counted once per iteration."""

import jax
import jax.numpy as jnp
import pytest

from experiments import bench_train


def _conv(x, w):
  return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                      dimension_numbers=("NHWC", "HWIO", "NHWC"))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matmul_and_convolution_flops_are_exact_and_the_same_for_every_dtype(dtype):
  a, b = jnp.ones((64, 128), dtype), jnp.ones((128, 256), dtype)
  assert bench_train.model_flops(jax.jit(lambda a, b: a @ b), a, b) == 2 * 64 * 128 * 256
  x, w = jnp.ones((8, 32, 32, 16), dtype), jnp.ones((3, 3, 16, 32), dtype)
  forward = 2 * 8 * 32 * 32 * 32 * 16 * 9
  assert bench_train.model_flops(jax.jit(_conv), x, w) == forward
  # The gradient with respect to the weights only: the forward and one convolution more.
  grad = jax.jit(jax.grad(lambda w, x: jnp.sum(_conv(x, w).astype(jnp.float32) ** 2)))
  assert bench_train.model_flops(grad, w, x) == 2 * forward


def test_a_scans_body_counts_once_per_iteration_and_shapes_suffice():
  def f(h, xs):
    return jax.lax.scan(lambda h, x: (jnp.tanh(h @ x), None), h, xs)[0]
  h = jax.ShapeDtypeStruct((4, 16), jnp.float32)
  xs = jax.ShapeDtypeStruct((24, 16, 16), jnp.float32)
  assert bench_train.model_flops(jax.jit(f), h, xs) == 24 * 2 * 4 * 16 * 16


def test_the_auto_dtype_resolves_for_the_platform():
  """model.dtype='auto' (the default) names what the model computes in: float32 on a CPU, where
  bench_train used to fail on it, bfloat16 on an accelerator; the peak is looked up by it."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict({"model": {"dtype": "auto"}})
  assert bench_train.dtype_name(config) == ("float32" if jax.default_backend() == "cpu"
                                            else "bfloat16")
  config.model.dtype = "bfloat16"
  assert bench_train.dtype_name(config) == "bfloat16"
