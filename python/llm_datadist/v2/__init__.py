"""The cache-manager mode of LLM-DataDist (CANN's ``llm_datadist.v2``), the only mode this
package has."""
