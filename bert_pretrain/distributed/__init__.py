"""Where and how a run computes: the device, the ranks and engines, the launcher."""
