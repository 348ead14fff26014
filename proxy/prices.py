"""Model prices (USD per million tokens) and the cost of one call. Stdlib only.

The table is `proxy/prices.json` unless a file of the same shape is given (addon option
`carc_prices`). A model is found by its exact name, then by the longest listed prefix
(`gpt-4o-mini-2024-07-18` -> `gpt-4o-mini`), then the same for the part after a `vendor/` prefix
(`openai/gpt-4o`). Prompt tokens are all charged at the input price (cache discounts ignored).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PRICES = Path(__file__).with_name("prices.json")


@dataclass(frozen=True)
class Price:
    input_per_m: float
    output_per_m: float


@dataclass(frozen=True)
class PriceTable:
    prices: dict[str, Price]
    source: str

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None) -> PriceTable:
        """Read a price file; errors name the file and the offending model."""
        path = Path(path) if path else DEFAULT_PRICES
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read the price table ({e})") from e
        models = data.get("models") if isinstance(data, dict) else None
        if not isinstance(models, dict):
            raise ValueError(f'{path}: expected {{"models": {{"<model>": {{"input": USD per '
                             f'million, "output": USD per million}}}}}}')
        prices = {}
        for name, entry in models.items():
            try:
                prices[name] = Price(float(entry["input"]), float(entry["output"]))
            except (TypeError, KeyError, ValueError) as e:
                raise ValueError(f"{path}: models.{name}: needs numeric 'input' and 'output' "
                                 f"(USD per million tokens), got {entry!r}") from e
        return cls(prices, str(path))

    def merged(self, other: PriceTable) -> PriceTable:
        """This table with `other`'s models added, and its prices where both list a model."""
        return PriceTable({**self.prices, **other.prices}, f"{self.source} + {other.source}")

    def with_price(self, model: str, input_per_m: float, output_per_m: float, source: str) -> PriceTable:
        return PriceTable({**self.prices, model: Price(input_per_m, output_per_m)},
                          f"{self.source} + {source}")

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the table in the shape `load` reads (written whole, then renamed)."""
        path = Path(path)
        data = {"about": f"USD per million tokens (input / output); from {self.source}",
                "models": {name: {"input": p.input_per_m, "output": p.output_per_m}
                           for name, p in self.prices.items()}}
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)

    def lookup(self, model: str | None) -> Price | None:
        if not model:
            return None
        names = [model] + ([model.rsplit("/", 1)[1]] if "/" in model else [])
        for name in names:
            if name in self.prices:
                return self.prices[name]
            prefixes = [p for p in self.prices if name.startswith(p)]
            if prefixes:
                return self.prices[max(prefixes, key=len)]
        return None

    def cost(self, model: str | None, prompt_tokens: int | None,
             completion_tokens: int | None) -> float | None:
        """USD for one call; None when the model has no price or no token count is known."""
        price = self.lookup(model)
        if price is None or (prompt_tokens is None and completion_tokens is None):
            return None
        return ((prompt_tokens or 0) * price.input_per_m
                + (completion_tokens or 0) * price.output_per_m) / 1e6
