import sys
print("load check: TODO")
