"""What both tiny offline models share: the words their tokenizers are built from, the ChatML
chat template, and the output weight that makes end-of-sequence and control tokens impossible.
Imported by make_gguf.py (project venv) and make_hf_llama.py (vLLM's venv): plain Python only."""

FORBIDDEN_LOGIT_WEIGHT = -64.0
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = (
    "the of and to in is it that for was on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will "
    "up other about out many then them these so some her would make like him into time has look two "
    "more write go see number no way could people my than first water been call who oil its now find "
    "long down day did get come made may part tail guard queue token batch slot fast slow"
).split()
