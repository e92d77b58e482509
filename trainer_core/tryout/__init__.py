"""Trying a model without training it: the prompt a chat model sees (chat_prompt), prompt sets (promptsets), searching
passages with an embedding model (search), speaking with a text-to-speech model (speak), and the checks of sample
answers (samples_check).
"""
