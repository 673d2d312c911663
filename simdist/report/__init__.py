"""Reports: text tables and plotly figures. The only package that draws."""
