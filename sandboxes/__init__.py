"""Docker sandbox per cell: images, private state volume, internal network, wipe, exec, limits."""
