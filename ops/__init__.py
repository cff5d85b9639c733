"""Operating the stack: push/label/promote/rollback, local stacks, load generation, drills.

The library side of ``scripts/``: each script there is a thin ``argparse`` entry point.
"""
