"""slime (THUDM/slime) and the adapter code its family (miles) shares."""
