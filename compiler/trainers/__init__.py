"""The trainers a compiled job can run (launch.trainer): rlc's own runtime, SkyRL's (skyrl.py) and verl's."""
