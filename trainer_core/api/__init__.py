"""OpenAI's ``files`` and ``fine_tuning.jobs`` API mapped onto the studio, without HTTP (gateway/api.py serves it).

- ``errors``: ApiError, OpenAI's error object ({"error": {message, type, param, code}}) with its HTTP status;
- ``datafile`` and ``files``: uploaded JSONL files in the datasets folder, checked by the studio's own format detection at upload
  (a bad line is named), OpenAI's preference rows converted to the studio's pairs;
- ``requests``: a create-job request read into a TrainConfig, every problem an ApiError naming its parameter;
- ``jobs``: an API job is an ordinary training run started through the orchestrator; its API fields live in a
  small record in the data root, its state in the run's row and folder, so a server restart loses nothing;
- ``timeline``: the run's timeline and metrics as OpenAI event objects, its checkpoints as checkpoint objects;
- ``models``: which models a job may start from, and the names ``/v1/chat/completions`` answers to;
- ``chat`` and ``servers``: a chat request's model -> a model source -> the studio's serve job that answers it.

Nothing here imports the ML stack.
"""
