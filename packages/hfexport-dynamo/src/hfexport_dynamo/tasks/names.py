"""The tasks hfexport-dynamo's tracer plans (``plan_task``) and the components their artifacts hold, as names only:
imported by the package's light ``__init__`` so that the backends' declarations list them (``Backend.tasks``) and
the CLI refuses an unknown ``--task`` before it loads a model or a toolchain."""

TEXT_GENERATION = "text-generation"
TEXT2TEXT_GENERATION = "text2text-generation"
SPEECH_RECOGNITION = "automatic-speech-recognition"
IMAGE_TEXT_TO_TEXT = "image-text-to-text"
AUDIO_TEXT_TO_TEXT = "audio-text-to-text"
TASKS = (TEXT_GENERATION, TEXT2TEXT_GENERATION, SPEECH_RECOGNITION, IMAGE_TEXT_TO_TEXT, AUDIO_TEXT_TO_TEXT)
# the tasks whose generate merges encoded media (images, audio) into the prompt's embeddings
MEDIA_TASKS = (IMAGE_TEXT_TO_TEXT, AUDIO_TEXT_TO_TEXT)

# the components: a decoder's one program (text-generation, and beside the media programs); an encoder-decoder's
# three; an image- or audio-text model's media encoder and token embedding
DECODER = "decoder"
ENCODER, PREFILL, DECODE = "encoder", "prefill", "decode"
VISION, AUDIO, EMBED = "vision", "audio", "embed"
