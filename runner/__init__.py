"""The tools that start, deploy and compare runs: launcher, Flower CLI wrapper, Ray head, staged app,
local/netns/docker deployment, certificates, comparison tables and the in-process engine."""
