"""This process's world: the environment report (env), FlyDSL readiness and the arch resolver
(readiness, facts), the rules' vocabulary (conditions), torch's switches read and set
(switches). What it knows of operators the catalogue hands over (routes); it never imports ops.
"""
