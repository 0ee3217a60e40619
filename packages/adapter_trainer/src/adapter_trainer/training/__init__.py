"""The training room: the recipe (setup / train / cleanup) and the library it is a leaf over."""
