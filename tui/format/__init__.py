"""One formatter each, for every number, byte count, duration and text the viewer prints."""
