"""The bottom layer: values and rules that know no record and no transaction.

The payload codec, the clock, durations, storable text, task tokens, schedule occurrences, the registry of
workflows and activities, and the types of search attributes. Everything else may import these; they
import only the fixed modules beside the package (``conf``, ``exceptions``, ``signals``, ``fields``).
"""
