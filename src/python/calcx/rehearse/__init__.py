"""calcx rehearse: server + controller + stub LLM + a dataset, end to end on one machine."""
