"""Launch targets: the files that start a compiled job on SkyPilot, Ray, KubeRay or here."""
