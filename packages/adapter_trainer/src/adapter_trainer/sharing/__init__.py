"""The sharing room: a trained adapter exported as a self-contained folder with a model card, pushed to the Hub."""
