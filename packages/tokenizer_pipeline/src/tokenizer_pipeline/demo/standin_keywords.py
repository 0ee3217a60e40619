"""The stand-in corpus's keyword tables: the caption words that `standin_attributes` looks for in a row's aspects.

Data only: the lowercase word lists, matched as whole words/phrases, and the family names. Which attribute
each table sets, and how, is the table in `standin_attributes`' docstring.
"""

from __future__ import annotations

# ---- keyword tables (lowercase; matched as whole words/phrases) ----
# fmt: off
FAMILY_WORDS: dict[str, tuple[str, ...]] = {
    "vocal": (
        "vocal", "vocals", "voice", "voices", "singer", "singers", "singing", "vocalist", "vocalists", "choir", "rap",
        "rapping", "vocalisation", "vocalization", "humming", "chant", "chanting",
    ),
    "bass": ("bass", "e-bass", "bassline", "bass line", "upright bass", "double bass", "synth bass", "bass guitar"),
    "piano": ("piano", "keyboard", "keyboards", "keys", "harpsichord", "rhodes", "e-piano"),
    "guitar": (
        "guitar", "guitars", "e-guitar", "e-guitars", "banjo", "mandolin", "ukulele", "harp", "sitar",
        "stringed instrument",
    ),
    "strings": (
        "strings", "string", "violin", "violins", "cello", "cellos", "viola", "orchestra", "orchestral", "fiddle",
        "string section",
    ),
    "synth": (
        "synth", "synths", "synthesizer", "synthesiser", "synthesizers", "synthesiser arrangements", "electronic",
        "electro", "edm", "techno", "trance",
    ),
    "organ": ("organ", "accordion", "harmonium"),
    "wind": (
        "flute", "flutes", "wind instrument", "wind", "clarinet", "recorder", "oboe", "whistle", "didgeridoo",
        "bagpipes", "bansuri", "pan flute",
    ),
    "brass": (
        "brass", "trumpet", "trumpets", "sax", "saxophone", "horn", "horns", "trombone", "tuba", "brass section",
        "brass band",
    ),
}
# Bass words that are drums, not the bass instrument.
NOT_BASS = ("bass drum", "bass drums", "kick")
# Priority inside one aspect: "soft female vocal" -> vocal, "bass guitar" -> bass, "synth bass" -> bass.
FAMILY_PRIORITY = ("vocal", "bass", "piano", "strings", "brass", "wind", "organ", "guitar", "synth")
# Used only when no aspect names an instrument.
GENRE_FAMILY: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("vocal", ("hip hop", "hip-hop", "r&b", "gospel", "a cappella", "opera", "soul")),
    ("synth", ("dance music", "club music", "dj", "house", "dubstep", "ambient")),
    ("guitar", ("rock", "metal", "punk", "country", "folk", "blues", "reggae")),
    ("strings", ("classical", "cinematic", "movie soundtrack", "soundtrack", "epic")),
    ("piano", ("jazz", "lullaby", "ballad")),
)
DEFAULT_FAMILY = "synth"
FAMILIES = ("piano", "guitar", "strings", "synth", "organ", "wind", "brass", "bass", "vocal")

FAST_WORDS = (
    "fast", "upbeat", "uptempo", "up-tempo", "energetic", "dance", "danceable", "edm", "techno", "trance", "club",
    "lively", "frantic", "high tempo", "quick",
)
SLOW_WORDS = (
    "slow", "mellow", "calm", "calming", "ballad", "relaxing", "relaxed", "lullaby", "soothing", "meditative",
    "ambient", "chill", "peaceful", "laid back", "gentle",
)
MINOR_WORDS = (
    "sad", "melancholic", "melancholy", "emotional", "dark", "minor", "sinister", "eerie", "haunting", "scary",
    "suspenseful", "mysterious", "sorrowful", "somber", "sombre", "gloomy", "horror", "depressing", "tragic", "ominous",
)
MAJOR_WORDS = (
    "happy", "joyful", "uplifting", "cheerful", "fun", "playful", "bright", "positive", "major", "buoyant",
    "happy mood", "optimistic", "jolly", "celebratory", "festive",
)
NOISE_WORDS = (
    "low quality", "noisy", "poor audio quality", "poor quality", "lo-fi", "lofi", "lo fi", "bad audio quality",
    "inferior audio quality", "low quality audio", "low quality recording", "amateur recording", "muffled",
    "distorted audio", "static", "hiss", "crackling",
)
DRUM_WORDS = (
    "drums", "drum", "drumming", "percussion", "percussions", "percussive", "beat", "beats", "kick", "snare", "hi hat",
    "hi hats", "hi-hat", "hi-hats", "hihat", "cymbal", "cymbals", "tabla", "tambourine", "claps", "clapping", "shaker",
    "shakers", "drum machine", "808", "bongo", "bongos", "conga", "congas",
)
HIGH_WORDS = (
    "female", "woman", "women", "girl", "soprano", "falsetto", "child", "children", "kid", "kids", "high pitched",
    "high-pitched", "high register", "high notes",
)
LOW_WORDS = (
    "deep", "low pitched", "low-pitched", "low register", "baritone", "bass voice", "bass vocal", "low notes",
    "sub bass", "sub-bass",
)
# fmt: on
