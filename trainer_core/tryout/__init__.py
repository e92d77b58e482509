"""Trying a model without training it: the prompt a chat model sees (chat_prompt), searching passages with an embedding
model (search) and speaking with a text-to-speech model (speak). Prompt sets are trainer_core.config.promptsets; the
checks of sample answers are trainer_core.evaluation.samples_check.
"""
