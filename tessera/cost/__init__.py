"""Stage `cost`: what a candidate kernel costs (analytical now; measured later)."""
from tessera.cost.analytical import AnalyticalCost
from tessera.cost.devices import DEVICES, PRECISIONS, Device, device

__all__ = ["AnalyticalCost", "DEVICES", "PRECISIONS", "Device", "device"]
