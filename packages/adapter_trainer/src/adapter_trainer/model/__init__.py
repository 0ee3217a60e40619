"""The model room: the MoT adapter and the builders that assemble it around the frozen towers.

Nothing here reads shard data or writes files.
"""
