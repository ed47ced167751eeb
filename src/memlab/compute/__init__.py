"""Part 7, trading compute for memory (chapter 7): FLOPs, checkpointing, accumulation, offload,
a memory planner and a scaling law fitted on models the book trains.

The pieces live in this folder's modules; their public names are re-exported here.
"""
