"""Prompt material: plain prompts that draw long answers, prompts that draw
emoji, CJK and Thai, and filler for huge prompts. Fixed text, so two runs (and
the two servers of a comparison) see the same requests.

Chat gets instructions; completions get the start of a text to continue (an
instruct model handed a bare instruction as a completion often stops at once).
"""

from __future__ import annotations

from sluice.audit.records import CHAT

STORY_PROMPTS = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a busy market in a large city from morning until night.",
    "List the planets of the solar system and describe each one.",
    "Tell the history of the bicycle in many paragraphs.",
    "Write a letter to a friend about a trip to the mountains.",
)

UTF8_PROMPTS = (
    "Reply only with emoji: describe a birthday party 🎉🎂🎈 using as many emoji as you can.",
    "Translate into Japanese and Chinese: 'Good morning, the weather is nice today.' 日本語と中文で書いてください。",
    "Write a greeting in Thai: สวัสดีครับ ยินดีต้อนรับ, then repeat it three times.",
    "Mix scripts: write 東京, 北京, กรุงเทพ, Москва and 🌍🚀✨ in one sentence.",
    "Write a list of animals with an emoji for each: 🐱 cat, 🐶 dog, 🦊 fox, 🐼 panda.",
    "用中文写一首关于月亮的短诗，然后加上表情符号 🌙⭐。",
)

CONTINUATION_PROMPTS = (
    "Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who",
    "A steam engine works in four simple steps. First,",
    "The market opens at dawn. The first traders arrive with",
    "The solar system has eight planets. The first one, Mercury,",
    "The first bicycles were built in the early nineteenth century, when",
    "Dear Anna, I have just come back from the mountains, and I must tell you that",
)

UTF8_CONTINUATIONS = (
    "Party emoji: 🎉🎂🎈🎁, more party emoji:",
    "Good morning in Japanese is おはようございます and in Chinese 早上好. Tokyo is 東京 and Beijing is",
    "Hello in Thai is สวัสดีครับ. Thank you in Thai is",
    "Cities of the world: 東京, 北京, กรุงเทพ, Москва,",
    "Animals with emoji: 🐱 cat, 🐶 dog, 🦊 fox, 🐼 panda,",
    "月亮的短诗：床前明月光，",
)


def prompt_for(endpoint: str, position: int, *, utf8: bool = False) -> str:
    """The position-th prompt of the kind that suits the endpoint."""
    if endpoint == CHAT:
        prompts = UTF8_PROMPTS if utf8 else STORY_PROMPTS
    else:
        prompts = UTF8_CONTINUATIONS if utf8 else CONTINUATION_PROMPTS
    return prompts[position % len(prompts)]


_FILLER_TEXT = (
    "the quick brown fox jumps over the lazy dog while the river runs past old stone "
    "bridges under a grey autumn sky and merchants count their coins in the square"
)
_FILLER_WORDS = tuple(_FILLER_TEXT.split(" "))


def huge_prompt(num_words: int, salt: int) -> str:
    """A long prompt of about `num_words` words; `salt` varies its start."""
    words = [_FILLER_WORDS[(salt + i) % len(_FILLER_WORDS)] for i in range(num_words)]
    return "Summarize the following text in one sentence.\n\n" + " ".join(words)
