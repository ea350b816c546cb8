"""TensorFlow on a GPU orch chose, with memory growth as the TensorFlow guide sets it up.

    python examples/python/tf_keras.py
    ORCH_DEVICES=sim:examples/sim/lab-8gpu.toml python examples/python/tf_keras.py   # CPU, sim lease

The seed's way, `tf.config.set_visible_devices(gpus[1], "GPU")`, picks a card by hand after
TensorFlow has listed them all; here orch picks it (atomically, by policy) before TensorFlow
starts, so TensorFlow only ever sees the leased GPU.
"""

import orch

lease = orch.use(gpus=1, min_free_memory="4GiB", wait=True, timeout="10m")  # before importing TF
print(f"leased {lease.id}: GPU {lease.devices[0].physical_index} ({lease.devices[0].uuid[:12]})")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

# Grow GPU memory as needed instead of taking it all at start (the TF guide's
# tf.config.experimental.set_memory_growth), so a shared card keeps room for others.
for gpu in tf.config.list_physical_devices("GPU"):
    tf.config.experimental.set_memory_growth(gpu, True)
print("TensorFlow sees:", tf.config.list_physical_devices("GPU") or "no GPU (the CPU runs it)")

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input(shape=(8,)), tf.keras.layers.Dense(1)])
model.compile(optimizer=tf.keras.optimizers.Adam(0.1), loss="mse")
history = model.fit(x, y, epochs=20, batch_size=64, verbose=0)
print(f"loss {history.history['loss'][-1]:.5f}")
lease.release()
